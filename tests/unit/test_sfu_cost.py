"""Special-function operations per element of a score (attnc/compiler/sfu_cost.py), which
decides whether the Hopper kernels move part of the softmax's exp2s to the FMA units: a
per-element call counts, a hoisted row-level one does not, a shared sub-expression counts once,
an f32 division by a per-element value counts its reciprocal."""

from __future__ import annotations

import pytest

from attnc.codegen.functor import emit_functor
from attnc.compiler.analysed import analysed
from attnc.compiler.pipeline import compile_source
from attnc.compiler.score_log2 import score_log2
from attnc.compiler.sfu_cost import sfu_ops_per_element


def _variant(body: str):
    text = f"variant v {{\n    param cap: f32 = 30.0;\n    param bias: tensor<f32>[num_qo_heads];\n{body}\n}}\n"
    compiled, _ = compile_source(text, "x.attn")
    return compiled[0].variant


@pytest.mark.parametrize(
    ("body", "ops"),
    [
        ("    score = cap * tanh(score / cap);", 1),
        ("    score = score + tanh(bias[qo_head]);", 0),  # row-level: hoisted
        ("    score = tanh(score) + tanh(score) * 2.0;", 1),  # one tanh, shared
        ("    score = sigmoid(score) + exp(score);", 3),
        ("    score = score / (1.0 + float(kv_idx));", 1),
        ("    score = score * 0.5;", 0),
    ],
)
def test_score_log2_costs(body, ops):
    assert sfu_ops_per_element(score_log2(_variant(body).score)) == ops


def test_none_costs_nothing():
    assert sfu_ops_per_element(None) == 0


def test_the_functor_declares_the_count():
    text = emit_functor(analysed(_variant("    score = cap * tanh(score / cap);")))
    assert "static constexpr int kScoreSfuOps = 1;" in text
    text = emit_functor(analysed(_variant("    score = score * 0.5;")))
    assert "static constexpr int kScoreSfuOps = 0;" in text
