"""Checked conversion of literal tokens (numbers, strings) and names into Python values."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from attnc.dsl.errors import AttnError, Loc

if TYPE_CHECKING:  # the command line reads INTEGER_TEXT without importing lark
    from lark import Token

I32_MAX = 2**31 - 1
F32_MAX = 3.4028234663852886e38
# Float literals are rounded to f32 (nearest, ties to even); from here on they round to inf.
F32_OVERFLOW = 2.0**128 - 2.0**103
# An integer written in ASCII digits with an optional sign, as the command line takes it:
# ``int()`` alone also reads other scripts' digits (``١٢٨`` is 128), ``1_000`` and spaces.
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
# A real number as the command line takes it, for the same reason (``float()`` reads
# ``١٢``, ``1_0`` and `` 1``): ASCII decimal with an optional exponent, or inf, infinity, nan.
FLOAT_TEXT = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)

# Words with a meaning in the grammar; none of them may name a variant, param, let or def.
# `doc` is not among them: it only starts a variant item (`doc "...";`), so the contextual
# lexer reads it as a name everywhere else (`param doc: tensor<i32>[kv_len];`, `doc[kv_idx]`).
KEYWORDS = frozenset(
    {
        "import",
        "def",
        "variant",
        "param",
        "let",
        "normalize",
        "kv_layout",
        "true",
        "false",
        "f32",
        "i32",
        "bool",
        "tensor",
    }
)


def token_loc(tok: Token, file: str) -> Loc:
    """The span of one token."""
    return Loc(file, tok.line or 0, tok.column or 0, tok.end_line or 0, tok.end_column or 0)


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def number_value(tok: Token, file: str) -> tuple[float | int, bool]:
    """``(value, is_float)`` of a NUMBER token; out-of-range literals are errors."""
    text = str(tok)
    if any(c in text for c in ".eE"):
        value = float(text)
        if not abs(value) < F32_OVERFLOW:
            raise AttnError(
                token_loc(tok, file), f"float literal '{_short(text)}' is out of range for f32"
            )
        return value, True
    # Leading zeros are dropped first: int() refuses texts of more than 4300 digits.
    digits = text.lstrip("0") or "0"
    if len(digits) > 10 or int(digits) > I32_MAX:
        raise AttnError(
            token_loc(tok, file),
            f"integer literal '{_short(text)}' is too large for i32 (at most {I32_MAX})",
        )
    return int(digits), False


def string_value(tok: Token, file: str) -> str:
    """The text of a STRING token without quotes; only ``\\"`` and ``\\\\`` escapes exist."""
    body = str(tok)[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in '"\\':
                col = (tok.column or 0) + 1 + i
                loc = Loc(file, tok.line or 0, col, tok.line or 0, col + 2)
                raise AttnError(loc, f"unknown escape '\\{nxt}' in string (only \\\" and \\\\)")
            out.append(nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def name_value(tok: Token, file: str) -> str:
    """A NAME token as a string; keywords are rejected."""
    text = str(tok)
    if text in KEYWORDS:
        raise AttnError(token_loc(tok, file), f"'{text}' is a keyword and cannot be used as a name")
    return text
