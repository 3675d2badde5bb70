"""Affine-score detection, hoisting levels and where the emitted functor computes hoisted values."""

from __future__ import annotations

import re

import pytest

from attnc.codegen.functor import emit_functor
from attnc.compiler import ir
from attnc.compiler.affine import analyse_affine
from attnc.compiler.hoist import hoistable, is_leaf, level
from attnc.compiler.pipeline import Compiled, compile_source, resolve_source

F, I = ir.F32, ir.I32  # noqa: E741
SCORE = ir.Builtin("score", F)
KV = ir.Builtin("kv_idx", I)
QPOS = ir.Builtin("q_pos", I)
QO_HEAD = ir.Builtin("qo_head", I)
SLOPE = ir.TensorLoad("slopes", (QO_HEAD,), F)
ONE, ZERO = ir.Const(1.0, F), ir.Const(0.0, F)


def stdlib(name: str) -> Compiled:
    compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
    assert len(compiled) == 1
    return compiled[0]


def inline(body: str) -> Compiled:
    compiled, _ = compile_source("variant v {\n" + body + "\n}\n", "x.attn")
    return compiled[0]


def test_alibi_is_affine_with_scale_one_and_slope_bias() -> None:
    a = stdlib("alibi").affine
    assert a is not None
    assert a.scale == ONE
    assert a.bias == ir.Binary("*", SLOPE, ir.Cast(ir.Binary("-", KV, QPOS, I), F), F)
    assert not a.identity


def test_two_score_plus_one_is_affine_scale_two() -> None:
    a = inline("    score = 2*score + 1;").affine
    assert a is not None
    assert (a.scale, a.bias, a.identity) == (ir.Const(2.0, F), ONE, False)


def test_row_level_scale_is_affine() -> None:
    a = inline("    param a: f32;\n    score = a * score * sm_scale + kv_idx;").affine
    assert a is not None
    assert a.scale == ir.Binary("*", ir.ParamRef("a", F), ir.Builtin("sm_scale", F), F)
    assert a.bias == ir.Cast(KV, F)


@pytest.mark.parametrize("name", ["softcap", "sigmoid"])
def test_nonlinear_scores_are_not_affine(name: str) -> None:
    assert stdlib(name).affine is None


def test_element_level_scale_is_not_affine() -> None:
    # the scale kv_idx changes per key: it cannot be folded into a per-row exp2 multiplier
    assert inline("    score = kv_idx * score;").affine is None


def test_score_squared_is_not_affine() -> None:
    assert inline("    score = score * score;").affine is None


@pytest.mark.parametrize("name", ["causal", "vanilla", "sliding_window", "prefix_lm"])
def test_identity_score(name: str) -> None:
    a = stdlib(name).affine
    assert a is not None
    assert (a.scale, a.bias, a.identity) == (ONE, ZERO, True)


def test_analyse_affine_of_none_and_bare_score() -> None:
    for score in (None, SCORE):
        a = analyse_affine(score)
        assert a is not None and a.identity


def test_hoisting_levels() -> None:
    assert level(SLOPE) == ir.HEAD
    assert level(QPOS) == ir.ROW
    assert level(ir.Builtin("q_idx", I)) == ir.ROW
    assert level(KV) == ir.ELEMENT
    assert level(SCORE) == ir.ELEMENT
    assert level(ir.ParamRef("cap", F)) == ir.REQUEST
    assert level(ir.Builtin("sm_scale", F)) == ir.REQUEST
    assert level(ir.Binary("-", KV, QPOS, I)) == ir.ELEMENT
    assert level(ir.Binary("*", SLOPE, ir.Cast(QPOS, F), F)) == ir.ROW
    assert level(ir.Builtin("out", F)) == ir.ELEMENT


def test_hoistable_alibi() -> None:
    score = stdlib("alibi").variant.score
    assert score is not None
    # below element level: the slope load (q_pos is a leaf, re-read for free)
    assert hoistable(score, ir.ELEMENT) == [SLOPE]
    assert hoistable(score, ir.ROW) == [SLOPE]
    assert hoistable(score, ir.HEAD) == []
    assert is_leaf(QPOS) and not is_leaf(SLOPE)


def test_hoistable_softcap_reciprocal_is_request_level() -> None:
    score = stdlib("softcap").variant.score
    assert score is not None
    reciprocal = ir.Binary("/", ONE, ir.ParamRef("cap", F), F)
    assert hoistable(score, ir.HEAD) == [reciprocal]
    assert hoistable(score, ir.ELEMENT) == [reciprocal]


def _function_body(source: str, signature: str) -> str:
    start = source.index(signature)
    open_brace = source.index("{", start)
    depth = 0
    for i in range(open_brace, len(source)):
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            depth -= 1
            if depth == 0:
                return source[open_brace + 1 : i]
    raise AssertionError(f"unterminated body of {signature}")


def test_alibi_functor_loads_slope_in_row_not_score() -> None:
    src = emit_functor(stdlib("alibi"))
    row = _function_body(src, "Row row(int q_idx, int qo_head) const")
    score = _function_body(src, "float score(const Row& row, float s, int kv_idx) const")
    loads = re.findall(r"row\.(\w+) = p\.p_slopes\[qo_head\];", row)
    assert len(loads) == 1
    assert "slopes" not in score
    assert score.strip() == (
        f"return (s + (row.{loads[0]} * "
        "static_cast<float>(int(unsigned(kv_idx) - unsigned(row.q_pos)))));"
    )
    assert f"float {loads[0]};" in _function_body(src, "struct Row")
    assert "static constexpr bool kAffineScore = true;" in src


def test_softcap_functor_hoists_reciprocal_into_constructor() -> None:
    src = emit_functor(stdlib("softcap"))
    ctor = _function_body(src, "Variant_softcap(const Params& params")
    score = _function_body(src, "float score(const Row& row, float s, int kv_idx) const")
    names = re.findall(r"(\w+) = \(1\.0f / p\.p_cap\);", ctor)
    assert len(names) == 1
    assert score.strip() == f"return (p.p_cap * attnc::vm::tanh_((s * {names[0]})));"
    assert "/" not in score
    assert "static constexpr bool kAffineScore = false;" in src
