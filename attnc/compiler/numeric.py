"""Owns: the language's number semantics on Python values (shared by folding and evaluation).

i32 arithmetic wraps like two's complement 32-bit integers; f32 values are IEEE binary32,
every literal and every folded result rounded to nearest (ties to even), with overflow to
``inf`` and ``nan`` where IEEE gives it. The kernels compute the same (see docs/language.md).
"""

from __future__ import annotations

import math
import struct

I32_MIN = -(2**31)
I32_MAX = 2**31 - 1
F32_MAX = 3.4028234663852886e38
# Values at or beyond this magnitude round to infinity in binary32 (FLT_MAX + half an ulp).
F32_OVERFLOW = 2.0**128 - 2.0**103
# The smallest normal binary32 magnitude; below it values are subnormal (the kernels may flush).
F32_MIN_NORMAL = 2.0**-126


def wrap_i32(x: int) -> int:
    """``x`` reduced to the i32 range modulo 2**32 (two's complement wrap)."""
    return (int(x) - I32_MIN) % 2**32 + I32_MIN


def round_f32(x: float) -> float:
    """``x`` rounded to the nearest binary32 value (``inf`` beyond the range, ``nan`` kept)."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return x
    if abs(x) >= F32_OVERFLOW:
        return math.copysign(math.inf, x)
    if abs(x) > F32_MAX:
        return math.copysign(F32_MAX, x)
    return struct.unpack("<f", struct.pack("<f", x))[0]


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
