"""Owns: the language's number semantics on Python values (shared by folding and evaluation).

i32 arithmetic wraps like two's complement 32-bit integers; f32 values are IEEE binary32,
every literal and every folded result rounded to nearest (ties to even), with overflow to
``inf`` and ``nan`` where IEEE gives it. The kernels compute the same (see docs/language.md).
"""

from __future__ import annotations

import math

# The i32 range (dsl.limits) and the largest f32 (dsl.literals), read here by the passes too.
from attnc.dsl.limits import I32_MAX as I32_MAX
from attnc.dsl.limits import I32_MIN
from attnc.dsl.literals import F32_MAX as F32_MAX
from attnc.dsl.literals import nearest_f32

# The least int that float() and then binary32 rounding take to infinity (F32_OVERFLOW less
# half a float64 ulp there, where float() rounds a tie to the even F32_OVERFLOW).
F32_INT_LIMIT = 2**128 - 2**103 - 2**74
# Ints from here on (in magnitude) overflow float(): float64's largest value plus half an ulp.
F64_INT_LIMIT = 2**1024 - 2**970
# The smallest normal binary32 magnitude; below it values are subnormal (the kernels may flush).
F32_MIN_NORMAL = 2.0**-126


def wrap_i32(x: int) -> int:
    """``x`` reduced to the i32 range modulo 2**32 (two's complement wrap)."""
    return (int(x) - I32_MIN) % 2**32 + I32_MIN


def round_f32(x: float) -> float:
    """``x`` rounded to the nearest binary32 value (``inf`` beyond the range, ``nan`` kept)."""
    return nearest_f32(float(x))


def is_finite(x: float) -> bool:
    """Neither infinite nor NaN."""
    return math.isfinite(x)


def shortest_f32_text(x: float) -> str:
    """The shortest decimal text that rounds back to the binary32 value ``x`` (finite)."""
    text = repr(x)
    for digits in range(1, 10):
        text = repr(float(f"{x:.{digits}g}"))
        if round_f32(float(text)) == x:
            break
    return text
