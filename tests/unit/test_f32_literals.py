"""Float literals are rounded to binary32 once, from the decimal text. They went through the
nearest double first, which moved them where that double is a binary32 midpoint."""

from __future__ import annotations

import math
import random
import struct
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest

import attnc
from attnc.dsl.errors import AttnError
from attnc.dsl.literals import F32_MAX, f32_literal


def _nearest_f32(text: str) -> float:
    """The oracle: the binary32 values around the double of ``text``, the nearest by exact
    rational distance, ties to the even significand."""
    exact, near = Fraction(text), float(text)
    bits = struct.unpack("<I", struct.pack("<f", min(abs(near), F32_MAX)))[0]
    around = [b for b in (bits - 1, bits, bits + 1) if 0 <= b < 0x7F800000]
    values = [math.copysign(struct.unpack("<f", struct.pack("<I", b))[0], near) for b in around]
    return min(values, key=lambda v: (abs(Fraction(v) - exact), struct.pack("<f", v)[0] & 1))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.00000005960464477539062500001", 1.0000001192092896),  # just above a midpoint
        ("1.000000059604644775390625", 1.0),  # the midpoint itself: to even
        ("1.00000005960464477539062499999", 1.0),
        ("-1.00000005960464477539062500001", -1.0000001192092896),
        ("3.40282356779733661637539395458142568446e38", F32_MAX),  # below the overflow midpoint
        ("3.4028235e38", F32_MAX),
        ("2.5e-45", 2.802596928649634e-45),  # subnormals
        ("7e-46", 0.0),
        ("1e-99999999", 0.0),
        ("0.1", 0.10000000149011612),
    ],
)
def test_literals_round_once_to_the_nearest_f32(text: str, value: float) -> None:
    assert f32_literal(text) == value


@pytest.mark.parametrize(
    "text", ["3.40282356779733661637539395458142568448e38", "1e400", "1e99999999"]
)
def test_literals_at_or_past_the_overflow_midpoint_are_out_of_range(text: str) -> None:
    assert f32_literal(text) is None
    with pytest.raises(AttnError, match="out of range for f32"):
        attnc.load(source=f"variant v {{ score = score * {text}; }}")


def test_random_literals_near_midpoints_agree_with_the_exact_rounding() -> None:
    rng = random.Random(5)
    with localcontext() as ctx:
        ctx.prec = 300
        for _ in range(3000):
            significand = rng.getrandbits(24) | (1 << 23)
            scale = Fraction(2) ** rng.randrange(-170, 100)
            nudge = Fraction(rng.choice([-1, 0, 1]), 10 ** rng.randrange(20, 40))
            value = (Fraction(2 * significand + 1, 2) + nudge) * scale * rng.choice([1, -1])
            text = str(Decimal(value.numerator) / Decimal(value.denominator))
            assert f32_literal(text) == _nearest_f32(text), text


def test_a_literal_just_above_a_midpoint_keeps_its_score() -> None:
    """score * 1.00000005960464477539062500001 was simplified to score (rounded to 1.0)."""
    from attnc.codegen import stages

    v = attnc.load(source="variant v { score = score * 1.00000005960464477539062500001; }")
    _, text = stages.emit_stage(v.compiled, "opt")
    assert "1.0000001" in text
