"""Generated functors compiled into the host harness (nvcc, else g++) agree with the PyTorch
reference on random points and tiles; a deliberately broken functor is caught."""

from __future__ import annotations

import pytest
from host_fixture import HARNESS_MARKS

import attnc.testing.host_test as host_test
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names
from attnc.testing.host_test import run_host_test

pytestmark = HARNESS_MARKS

POINTS = 1500

# Every param type (f32, i32, bool, 1-D and 2-D tensors of both element types), a select,
# tensor indices computed with %, and a transformed output.
ALL_PARAM_TYPES = """
variant all_params {
    param gain: f32 = 1.5;
    param shift: i32 = 3;
    param on: bool = true;
    param table: tensor<f32>[num_qo_heads, 4];
    param offs: tensor<i32>[num_kv_heads];
    score = on ? score * gain + table[qo_head, kv_idx % 4] : score - float(shift);
    mask = kv_idx + offs[kv_head] <= q_pos + shift;
    output = out * 2.0;
}
"""

# Integer division and modulo by params (C truncation, also for negative q_pos when
# q_len > kv_len) in the mask and in a select of the score.
BLOCKS = """
variant blocks {
    param block: i32 = 16;
    param stride: i32;
    let b = max(block, 1);
    mask = kv_idx / b <= q_pos / b && (kv_idx % max(stride, 1) == 0 || q_pos - kv_idx < b);
    score = (q_pos - kv_idx) % b == 0 ? score + 1.0 : score * 0.5;
}
"""

# A bool param switching between two score transforms and the mask, without softmax, with
# calls to abs/min/clamp/sigmoid and a division by a param turned into a hoisted reciprocal.
GATED = """
variant gated {
    param use_sigmoid: bool;
    param temp: f32 = 2.0;
    normalize = none;
    let d = abs(q_pos - kv_idx);
    score = use_sigmoid ? sigmoid(score / temp - float(min(d, 8))) : clamp(score, -1.0, 1.0);
    mask = !use_sigmoid || d < 64;
    output = out * 2.0;
}
"""


def compiled_of(text: str, file: str = "<string>"):
    compiled, warnings = compile_source(text, file)
    assert warnings == ()
    assert len(compiled) == 1
    return compiled[0]


@pytest.mark.parametrize("name", stdlib_names())
def test_stdlib_variant(name: str) -> None:
    report = run_host_test(compiled_of(*resolve_source(f"stdlib:{name}")), points=POINTS)
    assert report.ok, report.summary()
    assert report.points == POINTS
    assert report.mask_mismatches == 0 and report.tile_violations == []


@pytest.mark.parametrize(
    "text", [ALL_PARAM_TYPES, BLOCKS, GATED], ids=["all_params", "blocks", "gated"]
)
def test_hand_written_variant(text: str) -> None:
    report = run_host_test(compiled_of(text), points=POINTS, seed=1)
    assert report.ok, report.summary()
    assert report.points == POINTS


def test_wrong_functor_is_caught(monkeypatch) -> None:
    real = host_test.emit_functor

    def off_by_one(c):
        source = real(c)
        assert "return (kv_idx <= row.q_pos);" in source
        return source.replace("return (kv_idx <= row.q_pos);", "return (kv_idx < row.q_pos);")

    monkeypatch.setattr(host_test, "emit_functor", off_by_one)
    report = run_host_test(compiled_of(*resolve_source("stdlib:causal")), points=POINTS)
    assert not report.ok
    # the diagonal key is dropped: some sampled points land on it
    assert report.mask_mismatches > 0


@pytest.mark.parametrize(
    "original, broken, what",
    [
        ("return (2.0f * o);", "return (2.5f * o);", "output"),
        ("p.p_table[(row.qo_head * 4 + ", "p.p_table[(row.qo_head * 3 + ", "score"),
    ],
    ids=["output", "tensor-row-stride"],
)
def test_wrong_all_params_functor_is_caught(monkeypatch, original, broken, what) -> None:
    real = host_test.emit_functor

    def corrupt(c):
        source = real(c)
        assert original in source
        return source.replace(original, broken)

    monkeypatch.setattr(host_test, "emit_functor", corrupt)
    report = run_host_test(compiled_of(ALL_PARAM_TYPES), points=POINTS, seed=1)
    assert not report.ok
    assert getattr(report, f"{what}_error") > host_test.TOLERANCE
