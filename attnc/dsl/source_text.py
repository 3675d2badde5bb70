"""Owns: turning the bytes of a `.attn` file into text, with a located error for bad UTF-8."""

from __future__ import annotations

import codecs
import errno

from attnc.dsl.errors import SOURCES, AttnError, Loc
from attnc.dsl.limits import MAX_SOURCE_BYTES
from attnc.regular_file import read_regular


def decode_source(data: bytes, file: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped); invalid UTF-8 is an
    error at the line and column of the first bad byte (the line is quoted with the bad bytes
    replaced)."""
    if data.startswith(codecs.BOM_UTF8):  # some editors write one; it is not text
        data = data[len(codecs.BOM_UTF8) :]
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
    """The text of the file at ``path`` (``file``: the name errors give, default ``path``).
    A path that is not a regular file (``/dev/zero``, a pipe) or holds more than
    :data:`MAX_SOURCE_BYTES` is an ``OSError`` naming it, before anything is read."""
    data = read_regular(path, MAX_SOURCE_BYTES, "a .attn source is a file")
    if len(data) > MAX_SOURCE_BYTES:
        raise OSError(
            errno.EFBIG, f"larger than {MAX_SOURCE_BYTES} bytes, the limit of a .attn file", path
        )
    return decode_source(data, path if file is None else file)
