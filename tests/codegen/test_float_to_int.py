"""``int(x)`` of an f32 outside the i32 range or NaN: the language gives toward-zero
conversion saturated to the i32 range, NaN to 0, in every implementation. Before,
the torch reference converted to int64 unsaturated (``int(3e9)`` stayed 3e9, NaN became
-2^63), the host build of the functor cast with C++'s undefined conversion (INT_MIN on x86),
and the evaluator raised, so the three disagreed there (16 of these cases failed before)."""

from __future__ import annotations

import math

import pytest
import torch
from host_fixture import HARNESS_MARKS

import attnc
from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
CASES = [
    (math.nan, 0),
    (math.inf, I32_MAX),
    (-math.inf, I32_MIN),
    (3e9, I32_MAX),
    (-3e9, I32_MIN),
    (2147483520.0, 2147483520),  # the largest f32 below 2^31
    (-2147483648.0, I32_MIN),
    (-1.9, -1),
    (1.9, 1),
]
MASK = "variant v { param a: f32 = 0.0; mask = kv_idx <= int(a) / 4 + 2; }"
SCORE = "variant v { param a: f32 = 0.0; score = score + float(int(a) % 1000) * 0.001; }"


@pytest.mark.parametrize(("x", "want"), CASES)
def test_the_evaluator_saturates(x: float, want: int) -> None:
    cast = ir.Cast(ir.ParamRef("a", ir.F32), ir.I32)
    assert evaluate(cast, {"a": x}) == want


@pytest.mark.parametrize(("x", "want"), CASES)
def test_the_reference_saturates(x: float, want: int) -> None:
    v = attnc.load(source=MASK)
    q, k = torch.zeros(1, 1, 64, dtype=torch.float64), torch.zeros(40, 1, 64, dtype=torch.float64)
    vals = torch.arange(40, dtype=torch.float64).view(40, 1, 1).expand(40, 1, 64)
    o, lse = v.reference(q, k, vals, a=x, return_lse=True)
    # q is the last row (q_pos 39): the visible keys are 0 .. min(want / 4 + 2, 39), equal weights
    last = min(int(want / 4) + 2, 39)  # int(): C's truncating i32 division
    if last < 0:
        assert torch.isneginf(lse).all()
    else:
        assert o[0, 0, 0].item() == pytest.approx(last / 2)


@pytest.mark.parametrize("source", [MASK, SCORE], ids=["mask", "score"])
@pytest.mark.parametrize(("x", "want"), CASES)
@HARNESS_MARKS[0]
@HARNESS_MARKS[1]
def test_the_host_functor_matches_the_reference(source: str, x: float, want: int) -> None:
    compiled, _ = compile_source(source, "x.attn")
    report = run_host_test(compiled[0], points=200, seed=3, cases=1, fixed_params={"a": x})
    assert report.ok, report.summary()
    assert report.mask_mismatches == 0
