"""Simplification preserves meaning: stdlib variants and random well-typed IR, evaluated on
random environments; constant folding, reciprocal of parameter divisors, verifier."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import attnc
from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.pipeline import STDLIB_DIR, lower, parse, stdlib_names
from attnc.compiler.simplify import simplify_expr, simplify_variant
from attnc.compiler.verify import verify_variant

ROOT = Path(__file__).resolve().parents[2]

F, I, B = ir.F32, ir.I32, ir.BOOL  # noqa: E741
NUM_HEADS = 8

F_BUILTINS = ["score", "sm_scale"]
I_BUILTINS = [n for n, (t, _) in ir.BUILTINS.items() if t == I]
PARAMS = (
    ir.ParamDecl("c", "scalar", F),
    ir.ParamDecl("n", "scalar", I),
    ir.ParamDecl("flag", "scalar", B),
    ir.ParamDecl("t", "tensor", F, ("num_qo_heads",)),
)


class Gen:
    """Random well-typed IR over built-ins, params, constants, arithmetic, calls, casts,
    selects, comparisons and logic."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def expr(self, type_: str, depth: int) -> ir.Expr:
        if depth <= 0 or self.rng.random() < 0.2:
            return self.leaf(type_)
        return {F: self.f32, I: self.i32, B: self.bool}[type_](depth - 1)

    def leaf(self, type_: str) -> ir.Expr:
        r = self.rng
        if type_ == F:
            return r.choice(
                [
                    lambda: ir.Const(r.choice([0.0, 1.0, 2.0, 0.5, -3.0, r.uniform(-4, 4)]), F),
                    lambda: ir.Builtin(r.choice(F_BUILTINS), F),
                    lambda: ir.ParamRef("c", F),
                    lambda: ir.TensorLoad("t", (ir.Builtin("qo_head", I),), F),
                ]
            )()
        if type_ == I:
            return r.choice(
                [
                    lambda: ir.Const(r.choice([0, 1, 2, -1, 7, r.randint(-20, 20)]), I),
                    lambda: ir.Builtin(r.choice(I_BUILTINS), I),
                    lambda: ir.ParamRef("n", I),
                ]
            )()
        return r.choice([lambda: ir.Const(r.random() < 0.5, B), lambda: ir.ParamRef("flag", B)])()

    def f32(self, d: int) -> ir.Expr:
        r = self.rng
        kind = r.choice(["bin", "bin", "bin", "call1", "call2", "cast", "select", "neg"])
        if kind == "bin":
            return ir.Binary(r.choice("+-*/"), self.expr(F, d), self.expr(F, d), F)
        if kind == "call1":
            return ir.Call(r.choice(["tanh", "exp", "sigmoid", "abs"]), (self.expr(F, d),), F)
        if kind == "call2":
            return ir.Call(r.choice(["min", "max"]), (self.expr(F, d), self.expr(F, d)), F)
        if kind == "cast":
            return ir.Cast(self.expr(I, d), F)
        if kind == "select":
            return ir.Select(self.expr(B, d), self.expr(F, d), self.expr(F, d), F)
        return ir.Unary("neg", self.expr(F, d), F)

    def i32(self, d: int) -> ir.Expr:
        r = self.rng
        kind = r.choice(["bin", "bin", "bin", "call", "cast", "select", "neg"])
        if kind == "bin":
            return ir.Binary(
                r.choice(["+", "-", "*", "/", "%"]), self.expr(I, d), self.expr(I, d), I
            )
        if kind == "call":
            fn = r.choice(["min", "max", "abs"])
            args = (self.expr(I, d),) if fn == "abs" else (self.expr(I, d), self.expr(I, d))
            return ir.Call(fn, args, I)
        if kind == "cast":
            return ir.Cast(self.expr(F, d), I)
        if kind == "select":
            return ir.Select(self.expr(B, d), self.expr(I, d), self.expr(I, d), I)
        return ir.Unary("neg", self.expr(I, d), I)

    def bool(self, d: int) -> ir.Expr:
        r = self.rng
        kind = r.choice(["cmp", "cmp", "logic", "not"])
        if kind == "cmp":
            t = r.choice([I, I, F])
            return ir.Binary(r.choice(ir.COMPARISONS), self.expr(t, d), self.expr(t, d), B)
        if kind == "logic":
            return ir.Binary(r.choice(ir.LOGICAL), self.expr(B, d), self.expr(B, d), B)
        return ir.Unary("not", self.expr(B, d), B)


def random_env(rng: random.Random) -> tuple[dict, dict]:
    q_len = rng.randint(1, 200)
    kv_len = q_len + rng.randint(0, 200)
    q_idx = rng.randrange(q_len)
    env = {
        "score": rng.uniform(-8.0, 8.0),
        "sm_scale": rng.uniform(0.05, 1.0),
        "q_idx": q_idx,
        "q_pos": q_idx + kv_len - q_len,
        "kv_idx": rng.randrange(kv_len),
        "q_len": q_len,
        "kv_len": kv_len,
        "batch": rng.randint(0, 7),
        "qo_head": rng.randrange(NUM_HEADS),
        "kv_head": rng.randrange(2),
        "head_dim": rng.choice([64, 128]),
        "num_qo_heads": NUM_HEADS,
        "num_kv_heads": 2,
        "c": rng.choice([-1, 1]) * rng.uniform(0.25, 60.0),
        "n": rng.randint(-50, 300),
        "flag": rng.random() < 0.5,
        "out": rng.uniform(-3.0, 3.0),
        # stdlib params
        "cap": rng.uniform(1.0, 60.0),
        "window": rng.randint(0, 300),
        "prefix_len": rng.randint(0, 300),
        "bias": rng.uniform(-2.0, 2.0),
    }
    tensors = {
        "t": [rng.uniform(-2.0, 2.0) for _ in range(NUM_HEADS)],
        "slopes": [2.0 ** -(i + 1) for i in range(NUM_HEADS)],
        # language v2 stdlib tensors: per KV token, per request, per head
        "doc": sorted(rng.randint(0, 3) for _ in range(kv_len)),
        "window": [rng.randint(0, 300) for _ in range(8)],
        "sinks": [rng.uniform(-2.0, 2.0) for _ in range(NUM_HEADS)],
    }
    return env, tensors


def _value(e: ir.Expr, env: dict, tensors: dict):
    try:
        x = evaluate(e, env, tensors)
    except OverflowError:
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def same_value(e: ir.Expr, a, b) -> bool:
    if e.type == F:
        # Folded constants are binary32 values (docs/language.md), exact ones are not.
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    return a == b and type(a) is type(b)


def check_equivalent(original: ir.Expr, simplified: ir.Expr, rng: random.Random, n: int) -> int:
    """Number of compared points; asserts equality on each."""
    assert simplified.type == original.type
    compared = 0
    for _ in range(n):
        env, tensors = random_env(rng)
        a = _value(original, env, tensors)
        b = _value(simplified, env, tensors)
        if a is None or b is None:
            continue
        assert same_value(original, a, b), (original, simplified, env, a, b)
        compared += 1
    return compared


def stdlib_variants() -> list[ir.VariantIR]:
    out = []
    for name in stdlib_names():
        path = f"{STDLIB_DIR}/{name}.attn"
        out.extend(lower(parse(open(path, encoding="utf-8").read(), path)).variants)
    return out


@pytest.mark.parametrize("v", stdlib_variants(), ids=lambda v: v.name)
def test_stdlib_simplify_preserves_meaning(v: ir.VariantIR) -> None:
    s = simplify_variant(v)
    verify_variant(s, "simplify")
    rng = random.Random(hash(v.name) % 1000)
    for slot in ("score", "mask", "output", "sink"):
        before, after = getattr(v, slot), getattr(s, slot)
        assert (before is None) == (after is None)
        if before is not None:
            assert check_equivalent(before, after, rng, 300) == 300


RANDOM_CASES = 240


def test_random_expressions_preserve_meaning() -> None:
    compared_exprs = 0
    types = []
    for seed in range(RANDOM_CASES):
        gen = Gen(seed)
        type_ = (F, I, B)[seed % 3]
        e = gen.expr(type_, depth=4)
        s = simplify_expr(e)
        compared = check_equivalent(e, s, random.Random(seed), 25)
        if compared:
            compared_exprs += 1
            types.append(type_)
    # nearly all expressions have points where both sides are defined
    assert compared_exprs >= 200
    assert {F, I, B} <= set(types)


def test_random_scores_verify_after_simplify() -> None:
    for seed in range(60):
        e = Gen(1000 + seed).expr(F, depth=4)
        v = ir.VariantIR("r", "", PARAMS, e, Gen(2000 + seed).expr(B, 3), None)
        verify_variant(v, "lowering")
        verify_variant(simplify_variant(v), "simplify")


def score_of(body: str) -> ir.Expr:
    v = lower(parse("variant v {\n" + body + "\n}\n", "x.attn")).variant()
    assert v.score is not None
    return simplify_expr(v.score)


SCORE = ir.Builtin("score", F)


def test_constant_folding() -> None:
    assert score_of("    score = 2.0 * 3.0 + score;") == ir.Binary("+", SCORE, ir.Const(6.0, F), F)


def test_constant_folding_through_int_and_calls() -> None:
    assert score_of("    score = score * (max(2, 3) - 1) + exp(0.0);") == ir.Binary(
        "+", ir.Binary("*", ir.Const(2.0, F), SCORE, F), ir.Const(1.0, F), F
    )


def test_cancellation() -> None:
    assert score_of("    score = score + kv_idx - kv_idx;") == SCORE


def test_division_by_param_becomes_reciprocal() -> None:
    s = score_of("    param cap: f32 = 50.0;\n    score = cap * tanh(score / cap);")
    reciprocal = ir.Binary("/", ir.Const(1.0, F), ir.ParamRef("cap", F), F)
    assert reciprocal in list(ir.walk(s))
    assert ir.Call("tanh", (ir.Binary("*", SCORE, reciprocal, F),), F) in list(ir.walk(s))
    # no other division remains
    divisions = [n for n in ir.walk(s) if isinstance(n, ir.Binary) and n.op == "/"]
    assert divisions == [reciprocal]


def test_division_by_element_value_stays_a_division() -> None:
    s = score_of("    score = 1.0 / (score + 2.0) + kv_idx / 2;")
    divisions = [n for n in ir.walk(s) if isinstance(n, ir.Binary) and n.op == "/"]
    assert ir.Binary("/", ir.Const(1.0, F), ir.Binary("+", SCORE, ir.Const(2.0, F), F), F) in (
        divisions
    )
    # i32 division keeps C semantics (not turned into f32 arithmetic)
    assert any(d.type == I for d in divisions)


def test_bool_simplification() -> None:
    v = lower(
        parse("variant v {\n    mask = true && kv_idx <= q_pos || false;\n}\n", "x")
    ).variant()
    assert v.mask is not None
    assert simplify_expr(v.mask) == ir.Binary(
        "<=", ir.Builtin("kv_idx", I), ir.Builtin("q_pos", I), B
    )


def test_select_with_constant_condition() -> None:
    assert score_of("    score = 1 < 2 ? score + 1.0 : 0.0;") == ir.Binary(
        "+", SCORE, ir.Const(1.0, F), F
    )
    assert score_of("    score = 2 < 1 ? score + 1.0 : 0.5;") == ir.Const(0.5, F)


MUL_ONE_BUG = (
    "simplify.py SympyConverter._mul tests `coeff == 1`, but with SymPy >= 1.13 "
    "Float(1.0) == 1 is False, so a float coefficient 1.0 is kept: score * 1.0 becomes "
    "Binary('*', Const(1.0), score) instead of score"
)


def test_multiplication_by_float_one_is_removed() -> None:
    assert score_of("    score = score * 1.0;") == SCORE


def test_simplify_is_idempotent_on_stdlib() -> None:
    for v in stdlib_variants():
        s = simplify_variant(v)
        assert simplify_variant(s) == s, v.name


def test_locations_survive_simplify() -> None:
    v = lower(parse("variant v {\n    param c: f32;\n    score = score / c;\n}\n", "x")).variant()
    s = simplify_variant(v)
    assert s.score is not None and s.score.loc.line == 3


SM_SCALE = ir.Builtin("sm_scale", F)


def _element_multiplies(e: ir.Expr) -> int:
    """Multiplies and divisions evaluated per element (the rest is hoisted)."""
    from attnc.compiler.hoist import level

    ops = [n for n in ir.walk(e) if isinstance(n, ir.Binary) and n.op in "*/"]
    return sum(1 for n in ops if level(n) == ir.ELEMENT)


def test_lower_level_factors_of_a_product_are_grouped_for_hoisting() -> None:
    """``score * sm_scale / cap`` multiplies once per element: ``score * (sm_scale / cap)``
    (it was ``(score * sm_scale) * (1 / cap)``, two per element)."""
    cap = ir.ParamRef("cap", F)
    e = simplify_expr(ir.Binary("/", ir.Binary("*", SCORE, SM_SCALE, F), cap, F))
    assert e == ir.Binary("*", SCORE, ir.Binary("/", SM_SCALE, cap, F), F)
    two = simplify_expr(ir.Binary("*", ir.Binary("*", ir.Const(2.0, F), SCORE, F), SM_SCALE, F))
    assert _element_multiplies(two) == 1


def test_score_log2_folds_the_scale_and_log2e_into_hoisted_constants() -> None:
    """The kernels' exp2 argument of a soft-cap costs two multiplies per element besides the
    tanh (four before: sm_scale, 1 / cap, cap, log2 e), and means the same value."""
    from attnc.compiler.score_log2 import LOG2E, score_log2

    s = score_of("    param cap: f32 = 50.0;\n    score = cap * tanh(score / cap);")
    folded = score_log2(s)
    assert _element_multiplies(folded) == 2
    for raw, scale, cap in [(3.0, 0.125, 50.0), (-40.0, 0.09, 30.0), (0.5, 1.0, 2.0)]:
        got = evaluate(folded, {"score": raw, "sm_scale": scale, "cap": cap})
        want = LOG2E * cap * math.tanh(raw * scale / cap)
        assert got == pytest.approx(want, rel=1e-6)


def test_score_raw_folds_the_scale_and_bias_into_the_sigmoid_exp2() -> None:
    """Without softmax, sigmoid(score + bias) of the raw dot product costs one multiply per
    element before its exp2 (three before: sm_scale, + bias, -log2 e), and means the same
    value, also where the sigmoid saturates."""
    from attnc.compiler.score_raw import INV1P_EXP2, score_raw

    s = score_of("    param bias: f32 = 0.0;\n    score = sigmoid(score + bias);")
    folded = score_raw(s)
    assert isinstance(folded, ir.Call) and folded.fn == INV1P_EXP2
    assert _element_multiplies(folded) == 1
    cases = [(3.0, 0.125, -9.0), (-40.0, 0.09, 2.0), (0.5, 1.0, 0.0), (900.0, 1.0, 0.0)]
    cases += [(-900.0, 1.0, 0.0)]
    for raw, scale, bias in cases:
        got = evaluate(folded, {"score": raw, "sm_scale": scale, "bias": bias})
        want = _sigmoid(raw * scale + bias)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-300)


def test_score_raw_rewrites_nested_sigmoids() -> None:
    """Every sigmoid, nested ones too, becomes inv1p_exp2 of its argument in log2 units."""
    from attnc.compiler.score_raw import INV1P_EXP2, score_raw

    s = score_of("    score = sigmoid(sigmoid(score) * 3.0) - sigmoid(score);")
    folded = score_raw(s)
    calls = [n.fn for n in ir.postorder(folded) if isinstance(n, ir.Call)]
    assert calls and set(calls) == {INV1P_EXP2}
    for raw, scale in [(1.5, 0.5), (-20.0, 0.25)]:
        got = evaluate(folded, {"score": raw, "sm_scale": scale})
        want = _sigmoid(_sigmoid(raw * scale) * 3.0) - _sigmoid(raw * scale)
        assert got == pytest.approx(want, rel=1e-6)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


@pytest.mark.parametrize(
    ("score", "simplified"),
    [
        ("score + a * 0.0", "score = score "),
        ("score * a / a", "score = score "),
        ("score - score", "score = 0.0 "),
        ("(score + 16777216.0) - 16777216.0", "score = score "),
    ],
)
def test_f32_is_simplified_with_real_algebra_as_the_language_says(score, simplified) -> None:
    """docs/language.md: the simplifier treats f32 like fast-math (cancels, folds x * 0.0),
    so a NaN or inf only in a removed term does not reach the result. Pinned here so the
    document and the simplifier cannot drift apart."""
    from attnc.codegen import stages

    v = attnc.load(source=f"variant v {{ param a: f32 = 1.0; score = {score}; }}")
    _, text = stages.emit_stage(v.compiled, "opt")
    assert any(line.strip().startswith(simplified.strip()) for line in text.split("\n")), text
    assert "fast-math" in (ROOT / "docs" / "language.md").read_text()


@pytest.mark.parametrize(
    ("score", "value", "want"),
    [
        ("score * 1e20 * 1e20", 0.0, 0.0),  # folded to inf * score: NaN
        ("score * 1e20 * 1e20", 1e-30, 1e10),  # folded: inf
        ("score / 1e-30 / 1e-30", 0.0, 0.0),
        ("(score * a) * 1e20 * 1e20 - 5.0", 0.0, -5.0),  # through the affine form
        ("score * 1e-20 * 1e-20 * 1e30", 1e10, 1e10 * 1e-20 * 1e-20 * 1e30),  # folded to 0
    ],
)
def test_constants_are_not_folded_out_of_float32s_normal_range(score, value, want) -> None:
    """SymPy multiplied the finite literals 1e20 * 1e20 into one constant that float32 holds
    only as inf (or 1e-40 as a subnormal): the compiled score, its reference and the kernels
    gave NaN or inf where the source is finite. Such a tree now stays as written."""
    v = attnc.load(source=f"variant v {{ param a: f32 = 1.0; score = {score}; }}")
    env = {"score": value, "a": 1.0}
    got = evaluate(v.ir.score, env, binary32=True)
    assert got == pytest.approx(want, rel=1e-5)
    for c in ir.walk(v.ir.score):
        if isinstance(c, ir.Const) and c.type == F and c.value != 0.0:
            assert math.isfinite(c.value) and abs(c.value) >= 2.0**-126, c
