"""Checked conversion of literal tokens (numbers, strings) and names into Python values."""

from __future__ import annotations

import decimal
import math
import re
import struct
from typing import TYPE_CHECKING

from attnc.dsl.errors import AttnError, Loc
from attnc.dsl.limits import I32_MAX

if TYPE_CHECKING:  # the command line reads INTEGER_TEXT without importing lark
    from lark import Token

F32_MAX = 3.4028234663852886e38
# Float literals are rounded to f32 (nearest, ties to even); from here on they round to inf.
F32_OVERFLOW = 2.0**128 - 2.0**103
_F32_OVERFLOW_EXACT = decimal.Decimal(F32_OVERFLOW)
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


def short_text(text: str, limit: int = 24) -> str:
    """``text`` cut to ``limit`` characters for a message (a literal may be thousands long)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def f32_literal(text: str) -> float | None:
    """The binary32 value nearest the decimal ``text`` (ties to even), or None past the f32
    range. Rounded once, from the decimal: rounding its nearest double to binary32 again
    differs where that double is a midpoint of two binary32 values (``1.000000059604644775
    39062500001`` is just above one and rounds up; ``3.4028235677973366e38`` less a little is
    below the overflow midpoint and rounds to the largest f32)."""
    try:
        exact = decimal.Decimal(text)
    except decimal.InvalidOperation:  # an exponent past decimal's own limit (10^18)
        return _past_decimal_range(text)
    if exact.copy_abs() >= _F32_OVERFLOW_EXACT:  # copy_abs: exact (abs() rounds)
        return None
    near = float(text)  # the nearest double
    rounded = nearest_f32(near)
    if math.isinf(rounded):  # the double is the overflow midpoint; the decimal is below it
        return math.copysign(F32_MAX, near)
    if rounded == near:
        return rounded
    other = _f32_step(rounded, away=abs(near) > abs(rounded))
    midpoint = (rounded + other) / 2  # exact in a double (25 significant bits)
    if near != midpoint or exact == decimal.Decimal(midpoint):
        return rounded  # the double is not a tie, or the decimal is: as rounded
    farther = exact.copy_abs() > decimal.Decimal(midpoint).copy_abs()
    return max(rounded, other, key=abs) if farther else min(rounded, other, key=abs)


def _past_decimal_range(text: str) -> float | None:
    """A literal whose exponent decimal cannot hold: 0 for a zero or a negative exponent
    (far below the smallest f32), else past the f32 range (None)."""
    mantissa, _, exponent = text.lower().partition("e")
    negative = mantissa.startswith("-")
    # the exponent's sign, not int(): int() refuses texts of more than 4300 digits
    below = exponent.startswith("-") and exponent.lstrip("+-").strip("0") != ""
    if decimal.Decimal(mantissa) == 0 or below:
        return -0.0 if negative else 0.0
    return None


def nearest_f32(x: float) -> float:
    """``x`` rounded to binary32 (ties to even); inf past the range, NaN kept (the
    compiler's folding and the runtime's float32 checks use it too). A comparison, not a
    caught OverflowError, finds the range: ``torch.compile`` traces the runtime's checks."""
    if abs(x) >= F32_OVERFLOW:
        return math.copysign(math.inf, x)
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _f32_step(x: float, away: bool) -> float:
    """The binary32 value next to the binary32 ``x``, away from zero or toward it (x's
    sign; from 0, the least subnormal)."""
    bits = struct.unpack("<I", struct.pack("<f", abs(x)))[0]
    bits = bits + 1 if away else max(bits - 1, 0)
    return math.copysign(float(struct.unpack("<f", struct.pack("<I", bits))[0]), x)


def number_value(tok: Token, file: str) -> tuple[float | int, bool]:
    """``(value, is_float)`` of a NUMBER token; out-of-range literals are errors."""
    text = str(tok)
    if any(c in text for c in ".eE"):
        value = f32_literal(text)
        if value is None:
            raise AttnError(
                token_loc(tok, file), f"float literal '{short_text(text)}' is out of range for f32"
            )
        # The nearest double where it rounds to the same f32, so the AST keeps 0.1 (not
        # 0.10000000149011612); the f32 value itself where it does not.
        near = float(text)
        return (near if nearest_f32(near) == value else value), True
    # Leading zeros are dropped first: int() refuses texts of more than 4300 digits.
    digits = text.lstrip("0") or "0"
    if len(digits) > 10 or int(digits) > I32_MAX:
        hint = ""
        if digits == str(I32_MAX + 1):  # here without a unary minus: alone, or after a binary one
            hint = (
                f"; a unary minus applied to it, -{I32_MAX + 1}, is the least i32: "
                f"write x + -{I32_MAX + 1} for x - {I32_MAX + 1}"
            )
        raise AttnError(
            token_loc(tok, file),
            f"integer literal '{short_text(text)}' is too large for i32 (at most {I32_MAX}{hint})",
        )
    return int(digits), False


def is_i32_min_magnitude(tok: Token) -> bool:
    """True for an integer literal of value 2^31: under a unary minus it is the least i32,
    the one literal whose magnitude alone is out of range."""
    text = str(tok)
    return not any(c in text for c in ".eE") and (text.lstrip("0") or "0") == str(I32_MAX + 1)


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
