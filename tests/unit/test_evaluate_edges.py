"""The language's reference evaluator (compiler/evaluate.py, also the constant folder) at the
edges where it disagreed with the torch reference and the functor: the sign of zero through
rsqrt, floor and ceil (rsqrt(-0.0) gave +inf and was folded so into compiled code; the docs
define rsqrt(x) = 1 / sqrt(x), and sqrt(-0.0) is -0.0), and tensor reads outside the shape
(a negative index wrapped to the end like a Python list, one past the end raised IndexError;
the docs say such a read gives 0, in the kernels and the reference alike)."""

from __future__ import annotations

import math

import pytest
import torch

import attnc
from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate

F = ir.F32


def _call(fn: str, x: float) -> float:
    return evaluate(ir.Call(fn, (ir.Const(x, F),), F), {}, binary32=True)


@pytest.mark.parametrize(
    ("fn", "x", "want"),
    [
        ("rsqrt", -0.0, -math.inf),
        ("rsqrt", 0.0, math.inf),
        ("rsqrt", 4.0, 0.5),
        ("ceil", -0.5, -0.0),
        ("ceil", -0.0, -0.0),
        ("floor", -0.0, -0.0),
        ("floor", 0.5, 0.0),
        ("floor", -0.5, -1.0),
    ],
)
def test_signed_zero_follows_ieee(fn: str, x: float, want: float) -> None:
    got = _call(fn, x)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    torch_value = getattr(torch, fn)(torch.tensor(x, dtype=torch.float32)).item()
    assert math.copysign(1.0, got) == math.copysign(1.0, torch_value)


@pytest.mark.parametrize("text", ["score + rsqrt(-0.0)", "score + 1.0 / ceil(-0.5)"])
def test_folded_constants_keep_the_sign_of_zero(text: str) -> None:
    v = attnc.load(source=f"variant v {{ score = {text}; }}")
    assert evaluate(v.ir.score, {"score": 1.0}, binary32=True) == -math.inf


def test_tensor_reads_outside_the_shape_give_zero() -> None:
    v = attnc.load(source="variant v { param t: tensor<f32>[8]; score = score + t[kv_idx - 3]; }")
    t = [1.5 * (i + 1) for i in range(8)]
    values = [evaluate(v.ir.score, {"score": 1.0, "kv_idx": kv}, {"t": t}) for kv in range(12)]
    assert values == [1.0, 1.0, 1.0] + [1.0 + x for x in t] + [1.0]
