"""Owns: how user text may appear in generated C++/CUDA and Python.

User identifiers (params, variants) are validated by the grammar (``[A-Za-z_][A-Za-z0-9_]*``)
and always mangled with a prefix, so no name can collide with a C++ keyword, a CUDA or libc
macro (``INFINITY``, ``NULL``, ``ATTNC_HD``) or a name of the generated code itself. Free text
(file names, paths, doc strings) only ever appears inside comments, after
:func:`comment_text` has escaped every character that could end or continue a comment.
"""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
PARAM_PREFIX = "p_"
VARIANT_PREFIX = "Variant_"
COMMENT_LIMIT = 200  # longest comment text kept (the rest is elided)


def checked_identifier(name: str) -> str:
    """``name`` when it is an identifier of the language, else a ``ValueError``."""
    if not IDENTIFIER.match(name):
        raise ValueError(f"not an identifier of the language: {name!r}")
    return name


def param_field(name: str) -> str:
    """The C++ member (and ctypes field) name of the runtime param ``name``."""
    return PARAM_PREFIX + checked_identifier(name)


def variant_struct(name: str) -> str:
    """The C++ name of the functor struct of variant ``name``."""
    return VARIANT_PREFIX + checked_identifier(name)


def _escape_char(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def comment_text(text: str, limit: int = COMMENT_LIMIT) -> str:
    """``text`` made safe inside a ``//`` or ``/* */`` C++ comment and a ``#`` Python comment.

    Only printable ASCII stays as it is; every other character (control characters, line
    separators, non-ASCII, undecodable bytes) and the backslash become ``\\xNN``-style escapes,
    and ``*/`` becomes ``*\\/``, so the text can neither end the comment nor start a new line.
    """
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    out = "".join(c if " " <= c <= "~" and c != "\\" else _escape_char(c) for c in text)
    out = out.replace("*/", "*\\/")
    while "??" in out:  # one pass leaves '???' as '?\\??'
        out = out.replace("??", "?\\?")
    return out
