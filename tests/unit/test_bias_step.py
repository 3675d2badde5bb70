"""The bias-step analysis accepts affine biases that are exactly linear in kv_idx (ALiBi and
hand-made forms) with the right row-level step, checked by evaluating the bias at shifted
keys, and rejects every other use of kv_idx, including deep, shared and random shapes."""

from __future__ import annotations

import random

import pytest

from attnc.compiler import ir
from attnc.compiler.affine import analyse_affine
from attnc.compiler.bias_step import bias_step
from attnc.compiler.evaluate import evaluate
from attnc.compiler.hoist import level
from attnc.compiler.pipeline import compile_source, resolve_source

F, I = ir.F32, ir.I32  # noqa: E741
KV = ir.Builtin("kv_idx", I)
Q_POS = ir.Builtin("q_pos", I)
Q_IDX = ir.Builtin("q_idx", I)
C = ir.ParamRef("c", F)
SLOPE = ir.TensorLoad("s", (ir.Builtin("qo_head", I),), F)
PARAMS = (
    "param s: tensor<f32>[num_qo_heads]; param t: tensor<f32>[kv_len]; "
    "param c: f32 = 0.75; param n: i32 = 1;"
)


def affine_bias(score: str) -> ir.Expr:
    """The simplified affine bias of ``score = <score>`` in a variant with PARAMS."""
    compiled, _ = compile_source(f"variant v {{ {PARAMS} score = {score}; }}", "<test>")
    affine = analyse_affine(compiled[0].variant.score)
    assert affine is not None
    return affine.bias


def env_of(rng: random.Random, kv_idx: int) -> dict[str, object]:
    q_len, kv_len = rng.randint(1, 500), rng.randint(1, 4000)
    q_idx = rng.randrange(q_len)
    return {
        "kv_idx": kv_idx,
        "q_idx": q_idx,
        "q_pos": q_idx + kv_len - q_len,
        "qo_head": rng.randrange(4),
        "q_len": q_len,
        "kv_len": kv_len,
        "c": rng.uniform(-3.0, 3.0),
        "n": rng.randint(-5, 5),
        "score": 0.0,
        "sm_scale": 0.125,
    }


def assert_steps(bias: ir.Expr, step: ir.Expr, seed: int = 0) -> None:
    """bias(kv + k) - bias(kv) == k * step (double precision) at random rows and keys."""
    rng = random.Random(seed)
    tensors = {"s": [rng.uniform(-1.0, 1.0) for _ in range(4)]}
    for _ in range(50):
        kv = rng.randint(-200, 5000)
        env = env_of(rng, kv)
        base = evaluate(bias, env, tensors)
        for k in (1, 7, 121):
            shifted = evaluate(bias, {**env, "kv_idx": kv + k}, tensors)
            want = k * evaluate(step, env, tensors)
            assert shifted - base == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_alibi_steps_by_its_slope() -> None:
    compiled, _ = compile_source(*resolve_source("stdlib:alibi"))
    affine = analyse_affine(compiled[0].variant.score)
    assert affine is not None
    step = bias_step(affine.bias)
    assert step == ir.TensorLoad("slopes", (ir.Builtin("qo_head", I),), F)
    assert level(step) <= ir.ROW


@pytest.mark.parametrize(
    "score, want",
    [
        ("score + s[qo_head] * (kv_idx - q_pos)", SLOPE),
        ("score + s[qo_head] * (kv_idx - q_pos + 3)", SLOPE),
        ("score - float(kv_idx - q_pos)", ir.Const(-1.0, F)),
        ("score + float(kv_idx) * 0.5", ir.Const(0.5, F)),
        ("score + 2.0 * float(q_pos - kv_idx) + c * float(kv_idx - q_idx - 5)", None),
        ("score * c + s[qo_head] * float(kv_idx - q_pos) * c", None),
        ("score + float(kv_idx - q_pos) / c", None),  # a row-level reciprocal times an offset
        ("score + s[qo_head] * float(q_idx - kv_idx) + float(q_pos)", None),
    ],
)
def test_accepted_forms_step_exactly(score: str, want: ir.Expr | None) -> None:
    bias = affine_bias(score)
    step = bias_step(bias)
    assert step is not None and step.type == F and level(step) <= ir.ROW
    if want is not None:
        assert step == want
    assert_steps(bias, step)


@pytest.mark.parametrize(
    "score",
    [
        "score + tanh(float(kv_idx - q_pos))",  # kv_idx under a call
        "score + float(kv_idx * kv_idx)",  # i32 product
        "score + float(2 * kv_idx)",  # a coefficient other than ±1 inside the offset
        "score + float(kv_idx - q_pos) * float(kv_idx)",  # two kv_idx factors
        "score + t[kv_idx]",  # tensor read indexed by kv_idx
        "score + s[kv_idx % 4] * float(kv_idx)",
        "score + float(kv_idx / 2)",  # i32 division
        "score + float(kv_idx % 7)",  # modulo
        "score + c / float(kv_idx - q_pos)",  # kv_idx in a divisor
        "score + (kv_idx > q_pos ? 1.0 : 0.0)",  # select on kv_idx
        "score + (q_pos > 3 ? float(kv_idx) : 0.0)",  # select around a linear term
        "score + float(abs(kv_idx - q_pos))",
        "score + float(min(kv_idx, q_pos))",
        "score + float(kv_idx - n)",  # a scalar param may be any i32 (overflow)
        "score + float(kv_idx - q_pos - q_idx)",  # two row-level values
        "score + float(kv_idx + kv_len)",  # not a query position
        "score + float(kv_idx + 100000)",  # a large constant
        "score + float(kv_idx) * float(kv_idx - q_pos) * 0.0",
        "score + exp(float(kv_idx - q_pos) * c)",
        "score + c",  # no kv_idx at all: already hoisted per row
        "score",
    ],
)
def test_other_forms_are_rejected(score: str) -> None:
    assert bias_step(affine_bias(score)) is None


def test_non_affine_inputs_give_none() -> None:
    assert bias_step(None) is None
    assert bias_step(KV) is None  # an i32 value
    assert bias_step(ir.Binary("<", KV, Q_POS, ir.BOOL)) is None


def offset(*terms: ir.Expr, signs: tuple[int, ...] | None = None) -> ir.Expr:
    """A left-leaning i32 sum of ``terms`` with the given signs (all + by default)."""
    signs = signs or (1,) * len(terms)
    out = terms[0] if signs[0] > 0 else ir.Unary("neg", terms[0], I)
    for sign, term in zip(signs[1:], terms[1:], strict=True):
        out = ir.Binary("+" if sign > 0 else "-", out, term, I)
    return out


@pytest.mark.parametrize(
    "i32_offset, want",
    [
        (offset(KV, Q_POS, signs=(1, -1)), 1.0),
        (offset(Q_POS, KV, signs=(1, -1)), -1.0),
        (ir.Unary("neg", offset(KV, Q_IDX, signs=(1, -1)), I), -1.0),
        (ir.Binary("*", ir.Const(-1, I), KV, I), -1.0),
        (offset(KV, ir.Const(3, I), ir.Const(-5, I), Q_POS, signs=(1, 1, -1, -1)), 1.0),
        (offset(KV, KV, KV, signs=(1, -1, 1)), 1.0),  # kv_idx - kv_idx + kv_idx
    ],
)
def test_offset_shapes_built_by_hand(i32_offset: ir.Expr, want: float) -> None:
    bias = ir.Binary("*", C, ir.Cast(i32_offset, F), F)
    step = bias_step(bias)
    expect = C if want == 1.0 else ir.Unary("neg", C, F)
    assert step == expect
    assert_steps(bias, step)


@pytest.mark.parametrize(
    "i32_offset",
    [
        offset(KV, KV),  # coefficient 2
        # kv_idx + q_pos: about twice the request length, which wraps past 2**30 tokens
        offset(KV, ir.Const(3, I), Q_POS, signs=(1, 1, 1)),
        offset(KV, Q_IDX, signs=(-1, -1)),
        offset(KV, KV, signs=(1, -1)),  # coefficient 0
        offset(KV, Q_POS, Q_POS, signs=(1, -1, 1)),  # two query positions
        offset(KV, ir.Const(1 << 20, I)),
        offset(KV, *(ir.Const(1, I) for _ in range(12))),  # more terms than an offset has
        ir.Binary("*", ir.Const(2, I), KV, I),
        ir.Binary("*", Q_POS, KV, I),
        ir.Select(ir.Binary("<", KV, Q_POS, ir.BOOL), KV, Q_POS, I),
        ir.TensorLoad("n_tab", (KV,), I),
    ],
)
def test_hostile_offsets_are_rejected(i32_offset: ir.Expr) -> None:
    assert bias_step(ir.Binary("*", C, ir.Cast(i32_offset, F), F)) is None


def test_deep_and_shared_biases() -> None:
    """A 5000-deep unsimplified chain is analysed without recursion, and a DAG whose unfolded
    tree is 2**60 nodes costs its distinct nodes."""
    term = ir.Cast(offset(KV, Q_POS, signs=(1, -1)), F)
    chain: ir.Expr = ir.Binary("*", SLOPE, term, F)
    for i in range(5000):
        chain = ir.Binary("+" if i % 2 else "-", chain, ir.Binary("*", C, term, F), F)
    step = bias_step(chain)
    assert step is not None and level(step) <= ir.ROW
    assert_steps(chain, step, seed=1)
    shared: ir.Expr = term
    for _ in range(60):
        shared = ir.Binary("+", shared, shared, F)
    step = bias_step(shared)
    assert step is not None
    assert evaluate(step, {}) == 2.0**60


def test_deep_chain_with_one_rejected_leaf() -> None:
    bad = ir.Call("tanh", (ir.Cast(KV, F),), F)
    chain: ir.Expr = bad
    for _ in range(3000):
        chain = ir.Binary("+", chain, ir.Binary("*", C, ir.Cast(KV, F), F), F)
    assert bias_step(chain) is None


class LinearGen:
    """Random f32 biases mixing accepted pieces with ones that must be rejected."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def row_value(self) -> ir.Expr:
        return self.rng.choice([C, SLOPE, ir.Const(self.rng.uniform(-2, 2), F), ir.Cast(Q_POS, F)])

    def i32_offset(self) -> ir.Expr:
        terms = [KV] + self.rng.sample([Q_POS, Q_IDX, ir.Const(3, I), KV, ir.Const(-7, I)], 2)
        signs = [self.rng.choice([1, -1]) for _ in terms]
        for i, term in enumerate(terms):  # a position against kv_idx (else rejected)
            if term in (Q_POS, Q_IDX):
                signs[i] = -signs[0]
        return offset(*terms, signs=tuple(signs))

    def expr(self, depth: int) -> ir.Expr:
        r = self.rng.random()
        if depth <= 0 or r < 0.2:
            return ir.Cast(self.i32_offset(), F) if self.rng.random() < 0.6 else self.row_value()
        a, b = self.expr(depth - 1), self.expr(depth - 1)
        if r < 0.45:
            return ir.Binary(self.rng.choice(["+", "-"]), a, b, F)
        if r < 0.75:
            return ir.Binary("*", self.row_value(), a, F)
        if r < 0.85:
            return ir.Unary("neg", a, F)
        if r < 0.92:
            return ir.Binary("*", a, b, F)
        return ir.Call("tanh", (a,), F)


def test_random_biases_step_exactly_when_accepted() -> None:
    accepted = rejected = 0
    for seed in range(300):
        bias = LinearGen(seed).expr(4)
        step = bias_step(bias)
        if step is None:
            rejected += 1
            continue
        accepted += 1
        assert level(step) <= ir.ROW
        assert_steps(bias, step, seed)
    assert accepted > 50 and rejected > 20, (accepted, rejected)
