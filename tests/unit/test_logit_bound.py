"""The logit-bound analysis: bounds of scores built from bounded functions, checked by
evaluating the log2-domain logit (the form kernels compute) against the bound at random
scores, positions, params and tensors; None for every score that is unbounded; a NaN param the
bound reads makes the bound NaN (the launcher then keeps the online reference)."""

from __future__ import annotations

import math
import random

import pytest

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.logit_bound import logit_bound
from attnc.compiler.pipeline import compile_source, resolve_source
from attnc.compiler.score_log2 import score_log2

PARAMS = (
    "param t: tensor<f32>[num_qo_heads]; param c: f32 = 0.75; param n: i32 = 3; "
    "param b: bool = true;"
)


def log2_logit(score: str) -> ir.Expr:
    """The simplified log2-domain logit (score_log2) of ``score = <score>`` with PARAMS."""
    compiled, _ = compile_source(f"variant v {{ {PARAMS} score = {score}; }}", "<test>")
    return score_log2(compiled[0].variant.score)


def random_env(rng: random.Random) -> dict[str, object]:
    q_len, kv_len = rng.randint(1, 500), rng.randint(1, 4000)
    q_idx = rng.randrange(q_len)
    return {
        "score": rng.choice([rng.uniform(-5.0, 5.0), rng.uniform(-1e4, 1e4)]),
        "sm_scale": rng.choice([0.125, 1.0, 3.0]),
        "kv_idx": rng.randrange(kv_len),
        "q_idx": q_idx,
        "q_pos": q_idx + kv_len - q_len,
        "qo_head": rng.randrange(4),
        "q_len": q_len,
        "kv_len": kv_len,
        "c": rng.choice([rng.uniform(-40.0, 40.0), rng.uniform(-1e-3, 1e-3)]),
        "n": rng.randint(-50, 50),
        "b": rng.random() < 0.5,
    }


BOUNDED = [
    "c * tanh(score / c)",
    "30.0 * tanh(score / 30.0)",
    "c * sigmoid(score) - 2.0",
    "kv_idx > 3 ? tanh(score) * 4.0 : -tanh(score)",
    "b ? tanh(score) : c",
    "clamp(score, -5.0, 5.0)",
    "clamp(score * t[qo_head], -c, c)",
    "min(tanh(score), c)",
    "tanh(score) / c",
    "tanh(score) * float(n * 2)",
    "exp(tanh(score)) + softplus(2.0 * tanh(score))",
    "floor(c * tanh(score)) + ceil(sigmoid(score))",
    "abs(c) * tanh(score - float(kv_idx)) % 2.0",
    "sqrt(abs(tanh(score)) * 4.0)",
]


@pytest.mark.parametrize("score", BOUNDED)
def test_bound_holds_at_random_points(score: str) -> None:
    logit = log2_logit(score)
    bound = logit_bound(logit)
    assert bound is not None, score
    rng = random.Random(score)
    tensors = {"t": [rng.uniform(-3.0, 3.0) for _ in range(4)]}
    for _ in range(400):
        env = random_env(rng)
        value = evaluate(logit, env, tensors)
        b = evaluate(bound, env, tensors)
        if math.isnan(value):
            continue
        assert abs(value) <= b * (1 + 1e-9) + 1e-12, (score, env, value, b)


@pytest.mark.parametrize("score", BOUNDED)
def test_bound_reads_only_params_and_constants(score: str) -> None:
    bound = logit_bound(log2_logit(score))
    assert bound is not None
    for node in ir.walk(bound):
        assert not isinstance(node, (ir.Builtin, ir.TensorLoad)), (score, node)


@pytest.mark.parametrize(
    "score",
    [
        "score",
        "score * 2.0",
        "score + c",
        "tanh(score) * t[qo_head]",
        "tanh(score) * float(kv_idx)",
        "tanh(score) / score",
        "tanh(score) / t[qo_head]",
        "log(sigmoid(score))",
        "rsqrt(sigmoid(score))",
        "kv_idx > 3 ? tanh(score) : score",
        "tanh(score) * sm_scale",
        "c * tanh(score) + float(q_pos)",
        # bounded, but only by one side each: magnitudes do not see it (clamp() is the form)
        "min(max(score, -2.0), 3.0)",
    ],
)
def test_unbounded_scores_have_no_bound(score: str) -> None:
    assert logit_bound(log2_logit(score)) is None


def test_identity_and_non_finite_constants_have_no_bound() -> None:
    assert logit_bound(None) is None
    tanh = ir.Call("tanh", (ir.Builtin("score", ir.F32),), ir.F32)
    for value in (math.inf, -math.inf, math.nan):
        big = ir.Binary("*", tanh, ir.Const(value, ir.F32), ir.F32)
        assert logit_bound(big) is None
    # a product that overflows f32-sized folding stays finite in the analysis or has no bound
    huge = ir.Binary("*", tanh, ir.Const(1e300, ir.F32), ir.F32)
    huger = ir.Binary("*", huge, ir.Const(1e300, ir.F32), ir.F32)
    assert logit_bound(huger) is None


def test_a_nan_param_makes_the_bound_nan() -> None:
    """clamp(score, -c, c) with c NaN returns an unbounded score; so must the bound say."""
    bound = logit_bound(log2_logit("clamp(score, -c, c)"))
    assert bound is not None
    env = {"c": math.nan, "n": 1, "b": True}
    assert math.isnan(evaluate(bound, env))
    sel = logit_bound(log2_logit("b ? tanh(score) : c"))
    assert sel is not None and math.isnan(evaluate(sel, env))


def test_a_zero_divisor_gives_an_unusable_bound() -> None:
    bound = logit_bound(log2_logit("tanh(score) / c"))
    assert bound is not None
    value = evaluate(bound, {"c": 0.0})
    assert not math.isfinite(value) or math.isnan(value)


def test_stdlib_softcap_is_bounded_by_its_cap_and_others_are_not() -> None:
    compiled, _ = compile_source(*resolve_source("stdlib:softcap"))
    bound = logit_bound(score_log2(compiled[0].variant.score))
    assert bound is not None
    for cap in (30.0, -30.0, 50.0):
        assert evaluate(bound, {"cap": cap}) == pytest.approx(abs(cap) / math.log(2.0), rel=1e-6)
    for name in ("causal", "alibi", "vanilla", "sliding_window", "prefix_lm"):
        compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
        variant = compiled[0].variant
        assert logit_bound(score_log2(variant.score)) is None, name
