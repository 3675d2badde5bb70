"""Owns: turning the bytes of a `.attn` file into text, with a located error for bad UTF-8."""

from __future__ import annotations

from attnc.dsl.errors import SOURCES, AttnError, Loc


def decode_source(data: bytes, file: str) -> str:
    """``data`` decoded as UTF-8; invalid UTF-8 is an error at the line and column of the
    first bad byte (the line is quoted with the bad bytes replaced)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line = data.count(b"\n", 0, err.start) + 1
        col = len(data[line_start : err.start].decode("utf-8", "replace")) + 1
        SOURCES.add(file, data.decode("utf-8", "replace"))
        raise AttnError(
            Loc(file, line, col, line, col + 1),
            f"invalid UTF-8 (byte 0x{data[err.start]:02x}): .attn files are UTF-8 text",
        ) from None


def read_source(path: str, file: str | None = None) -> str:
    """The text of the file at ``path`` (``file``: the name errors give, default ``path``)."""
    with open(path, "rb") as f:
        data = f.read()
    return decode_source(data, path if file is None else file)
