"""Mask analysis against brute force: every tile class and KV range is checked against the
IR evaluator over all (q_idx, kv_idx) pairs of random requests and random parameter values.

Tiles handed to ``classify`` lie inside the valid range (0 <= q0 < q1 <= q_len,
0 <= k0 < k1 <= kv_len), as the kernels clip them before asking.
"""

from __future__ import annotations

import random

import pytest

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.mask_analysis import MaskAnalysis, analyse_mask, classify, kv_range

I32, F32, BOOL = ir.I32, ir.F32, ir.BOOL


def b(name: str) -> ir.Expr:
    return ir.Builtin(name, ir.BUILTINS[name][0])


def p(name: str, type_: str = I32) -> ir.Expr:
    return ir.ParamRef(name, type_)


def c(value: int) -> ir.Expr:
    return ir.Const(value, I32)


def op(name: str, x: ir.Expr, y: ir.Expr) -> ir.Expr:
    kind = BOOL if name in ir.COMPARISONS or name in ir.LOGICAL else x.type
    return ir.Binary(name, x, y, kind)


def neg(x: ir.Expr) -> ir.Expr:
    return ir.Unary("neg", x, x.type)


def not_(x: ir.Expr) -> ir.Expr:
    return ir.Unary("not", x, BOOL)


Q, QP, K = b("q_idx"), b("q_pos"), b("kv_idx")
QL, KL = b("q_len"), b("kv_len")
W = p("window")
CAUSAL = op("<=", K, QP)
WINDOW = op("&&", CAUSAL, op("<", op("-", QP, K), W))
PREFIX_LM = op("||", op("<", K, p("prefix_len")), CAUSAL)
TRUE, FALSE = ir.Const(True, BOOL), ir.Const(False, BOOL)


# ---------------------------------------------------------------------------------------------
# Brute force


def random_env(rng: random.Random, q_len: int, kv_len: int) -> dict[str, int]:
    return {
        "q_len": q_len,
        "kv_len": kv_len,
        "window": rng.choice([0, 1, 2, rng.randint(-3, 50)]),
        "prefix_len": rng.randint(-2, kv_len + 2),
        "stride": rng.randint(-3, 4),
        "flag": rng.choice([0, 1]),
    }


def visible(mask: ir.Expr | None, env: dict[str, int]) -> list[list[bool]]:
    """vis[q][k] for every pair of the request."""
    out = []
    for q in range(env["q_len"]):
        row = []
        for k in range(env["kv_len"]):
            scope = dict(env, q_idx=q, kv_idx=k, q_pos=q + env["kv_len"] - env["q_len"])
            scope.update(qo_head=1, kv_head=0, score=0.25, sm_scale=1.0)
            row.append(True if mask is None else bool(evaluate(mask, scope)))
        out.append(row)
    return out


def random_tiles(rng: random.Random, q_len: int, kv_len: int, n: int):
    for _ in range(n):
        q0 = rng.randrange(q_len)
        k0 = rng.randrange(kv_len)
        yield q0, rng.randint(q0 + 1, q_len), k0, rng.randint(k0 + 1, kv_len)
    for tq, tk in ((1, 1), (4, 8), (16, 16)):
        for q0 in range(0, q_len, tq):
            for k0 in range(0, kv_len, tk):
                yield q0, min(q0 + tq, q_len), k0, min(k0 + tk, kv_len)


def true_class(vis, q0, q1, k0, k1) -> str:
    cells = [vis[q][k] for q in range(q0, q1) for k in range(k0, k1)]
    return "full" if all(cells) else ("empty" if not any(cells) else "partial")


def true_range(vis, q0, q1) -> tuple[int, int] | None:
    ks = [k for q in range(q0, q1) for k, v in enumerate(vis[q]) if v]
    return (min(ks), max(ks) + 1) if ks else None


def check(a: MaskAnalysis, mask, env, rng, exact: bool, tiles: int = 60) -> None:
    """Conservative on every tile; with ``exact``, also tight."""
    vis = visible(mask, env)
    for q0, q1, k0, k1 in random_tiles(rng, env["q_len"], env["kv_len"], tiles):
        want = true_class(vis, q0, q1, k0, k1)
        got = classify(a, q0, q1, k0, k1, env)
        where = f"tile q[{q0},{q1}) kv[{k0},{k1}) env={env}"
        assert got == want or (got == "partial" and not exact), f"{got} != {want} at {where}"
        begin, end = kv_range(a, q0, q1, env)
        want_range = true_range(vis, q0, q1)
        assert 0 <= begin and end <= env["kv_len"], where
        if want_range is None:
            assert begin >= end or not exact, where
        else:
            assert begin <= want_range[0] and want_range[1] <= end, where
            if exact:
                assert (begin, end) == want_range, where


SHAPES = [(1, 1), (1, 9), (9, 1), (7, 20), (20, 7), (13, 13), (1, 33), (33, 40), (40, 33)]


def sweep(mask, exact: bool, kind: str = "linear", seeds: int = 3) -> None:
    a = analyse_mask(mask)
    assert a.kind == kind, a.describe()
    for seed in range(seeds):
        rng = random.Random(seed)
        for q_len, kv_len in SHAPES:
            check(a, mask, random_env(rng, q_len, kv_len), rng, exact)


# ---------------------------------------------------------------------------------------------
# Linear masks: conservative and (unit coefficients) exact


UNIT_MASKS = {
    "causal": CAUSAL,
    "causal_canonical": op("<=", op("-", K, Q), op("-", KL, QL)),
    "causal_swapped": op(">=", QP, K),
    "causal_zero_left": op("<=", c(0), op("-", QP, K)),
    "causal_neg": op(">=", op("+", neg(K), QP), c(0)),
    "not_greater": not_(op(">", K, QP)),
    "q_idx_ge_kv": op(">=", Q, K),
    "diagonal": op("==", K, QP),
    "shifted_diagonal": op("==", op("-", K, c(3)), Q),
    "window": WINDOW,
    "window_canonical": op("&&", op(">=", op("-", QP, K), c(0)), op(">", W, op("-", QP, K))),
    "window_only": op("<", op("-", QP, K), W),
    "not_or": not_(op("||", op(">", K, QP), op(">=", op("-", QP, K), W))),
    "double_not": not_(not_(CAUSAL)),
    "kv_below_q_len": op("<", K, QL),
    "gated_by_flag": op("&&", op(">", p("flag"), c(0)), CAUSAL),
    "param_product": op("<", K, op("*", W, p("stride"))),
    "true_and_causal": op("&&", TRUE, CAUSAL),
    "band": op("&&", op("<=", op("-", K, c(2)), QP), op(">=", op("+", K, c(2)), QP)),
}


@pytest.mark.parametrize("name", sorted(UNIT_MASKS))
def test_unit_coefficient_masks_are_exact(name):
    sweep(UNIT_MASKS[name], exact=True)


SCALED_MASKS = {
    "two_kv_le_qpos_plus_3": op("<=", op("*", c(2), K), op("+", QP, c(3))),
    "three_q_minus_two_kv": op(">", op("-", op("*", c(3), Q), op("*", K, c(2))), W),
    "scaled_equality": op("==", op("*", c(2), K), Q),
    "three_kv_ge_qpos_minus_4": op(">=", op("*", K, c(3)), op("-", QP, c(4))),
    "scaled_window": op(
        "&&", op("<=", op("*", c(2), K), op("*", c(3), QP)), op("<", op("-", QP, K), W)
    ),
}


@pytest.mark.parametrize("name", sorted(SCALED_MASKS))
def test_scaled_coefficient_masks_are_conservative(name):
    sweep(SCALED_MASKS[name], exact=False)


@pytest.mark.parametrize("name", ["two_kv_le_qpos_plus_3", "three_kv_ge_qpos_minus_4"])
def test_single_scaled_constraint_is_exact(name):
    # One constraint: corners decide FULL/EMPTY exactly, and the projection is exact.
    sweep(SCALED_MASKS[name], exact=True)


@pytest.mark.parametrize("window", [0, 1, 2, 5, -1])
def test_sliding_window_fixed_widths(window):
    a = analyse_mask(WINDOW)
    rng = random.Random(window)
    for q_len, kv_len in SHAPES:
        env = dict(random_env(rng, q_len, kv_len), window=window)
        check(a, WINDOW, env, rng, exact=True)


def test_window_zero_is_empty_everywhere():
    a = analyse_mask(WINDOW)
    env = {"q_len": 16, "kv_len": 40, "window": 0}
    assert kv_range(a, 0, 16, env) == (0, 0)
    assert classify(a, 0, 16, 0, 40, env) == "empty"


# ---------------------------------------------------------------------------------------------
# Opaque masks: PARTIAL everywhere and the whole KV range


OPAQUE_MASKS = {
    "prefix_lm": (PREFIX_LM, "uses ||"),
    "head_term": (op("<=", K, op("+", QP, b("qo_head"))), "uses qo_head"),
    "division": (op("<=", op("/", K, c(2)), QP), "uses /"),
    "modulo": (op("==", op("%", K, c(4)), c(0)), "uses %"),
    "not_equal": (op("!=", K, QP), "uses != on indices"),
    "negated_and": (not_(WINDOW), "uses a negated &&"),
    "float_compare": (op("<", ir.Cast(K, F32), p("limit", F32)), "compares f32 values"),
    "bool_param": (op("&&", p("on", BOOL), CAUSAL), "uses bool on as a condition"),
    "variable_coefficient": (op("<=", op("*", W, K), QP), "has a non-constant coefficient"),
    "quadratic": (op("<=", op("*", K, K), QP), "has a non-constant coefficient"),
    "tensor": (
        op("<=", K, ir.TensorLoad("lens", (b("qo_head"),), I32)),
        "uses tensor lens",
    ),
}


@pytest.mark.parametrize("name", sorted(OPAQUE_MASKS))
def test_opaque_masks(name):
    mask, reason = OPAQUE_MASKS[name]
    a = analyse_mask(mask)
    assert a.kind == "opaque"
    assert a.describe() == f"opaque: {reason}"
    env = {"q_len": 5, "kv_len": 7}
    assert kv_range(a, 1, 3, env) == (0, 7)
    assert classify(a, 0, 5, 0, 7, env) == "partial"


def test_prefix_lm_is_conservative():
    a = analyse_mask(PREFIX_LM)
    for seed in range(3):
        rng = random.Random(seed)
        for q_len, kv_len in SHAPES:
            env = random_env(rng, q_len, kv_len)
            env["tensor_free"] = 0
            check(a, PREFIX_LM, env, rng, exact=False)


# ---------------------------------------------------------------------------------------------
# No mask and constants


def test_no_mask():
    a = analyse_mask(None)
    assert a.kind == "none" and a.describe() == "none: no mask"
    sweep(None, exact=True, kind="none", seeds=1)


def test_constant_true_is_full():
    a = analyse_mask(TRUE)
    assert (a.kind, a.constraints) == ("linear", ())
    sweep(TRUE, exact=True, seeds=1)


@pytest.mark.parametrize("mask", [FALSE, op("&&", CAUSAL, FALSE), not_(TRUE), op("<", c(3), c(2))])
def test_constant_false_is_empty(mask):
    a = analyse_mask(mask)
    assert a.kind == "linear"
    sweep(mask, exact=True, seeds=1)
    assert classify(a, 0, 4, 0, 4, {"q_len": 4, "kv_len": 4}) == "empty"


def test_empty_query_range_and_empty_tile():
    a = analyse_mask(CAUSAL)
    env = {"q_len": 4, "kv_len": 8}
    assert kv_range(a, 2, 2, env) == (0, 0)
    assert classify(a, 1, 1, 0, 8, env) == "empty"


# ---------------------------------------------------------------------------------------------
# Structure


def test_causal_constraint_form():
    (con,) = analyse_mask(CAUSAL).constraints
    assert (con.cq, con.ck) == (1, -1)
    assert con.c.type == I32
    env = {"q_len": 3, "kv_len": 11}
    assert evaluate(con.c, env) == 8 == con.c_value(env)


def test_canonical_forms_agree():
    forms = [UNIT_MASKS[n] for n in ("causal", "causal_canonical", "causal_swapped")]
    forms += [UNIT_MASKS[n] for n in ("causal_zero_left", "causal_neg", "not_greater")]
    analyses = {analyse_mask(m) for m in forms}
    assert len(analyses) == 1


def test_strict_inequality_and_equality_split():
    a = analyse_mask(op("<", K, QP))
    (con,) = a.constraints
    assert (con.cq, con.ck, con.c_value({"q_len": 2, "kv_len": 2})) == (1, -1, -1)
    assert len(analyse_mask(op("==", K, QP)).constraints) == 2


def test_gcd_reduction_rounds_down():
    # 2*q_idx - 2*kv_idx + 3 >= 0  <=>  q_idx - kv_idx + 1 >= 0 over integers
    mask = op(">=", op("+", op("*", c(2), op("-", Q, K)), c(3)), c(0))
    (con,) = analyse_mask(mask).constraints
    assert (con.cq, con.ck, con.terms, con.offset) == (1, -1, (), 1)


def test_describe_linear():
    a = analyse_mask(WINDOW)
    assert a.describe() == (
        "linear: 2 constraints [1*q_idx + -1*kv_idx + 1*kv_len + -1*q_len + 0 >= 0; "
        "-1*q_idx + 1*kv_idx + -1*kv_len + 1*q_len + 1*window + -1 >= 0]"
    )
    assert analyse_mask(TRUE).describe() == "linear: 0 constraints"
