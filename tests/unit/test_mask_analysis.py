"""Mask analysis against brute force: every tile class and KV range is checked against the
IR evaluator over all (q_idx, kv_idx) pairs of random requests and random parameter values.
Tiles handed to ``classify`` (tests/tile_class_oracle.py) lie inside the valid range
(0 <= q0 < q1 <= q_len, 0 <= k0 < k1 <= kv_len), as the kernels clip them before asking.
"""

from __future__ import annotations

import random

import pytest
from tile_class_oracle import classify

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.mask_analysis import MaskAnalysis, analyse_mask
from attnc.compiler.mask_tiles import kv_range

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


def check(
    a: MaskAnalysis,
    mask,
    env,
    rng,
    exact: bool,
    tiles: int = 60,
    exact_range: bool | None = None,
    exact_empty: bool | None = None,
) -> None:
    """Conservative on every tile; with ``exact``, also tight. ``exact_range`` (KV ranges
    tight) and ``exact_empty`` (EMPTY whenever no pair is visible) default to ``exact``."""
    exact_range = exact if exact_range is None else exact_range
    exact_empty = exact if exact_empty is None else exact_empty
    vis = visible(mask, env)
    for q0, q1, k0, k1 in random_tiles(rng, env["q_len"], env["kv_len"], tiles):
        want = true_class(vis, q0, q1, k0, k1)
        got = classify(a, q0, q1, k0, k1, env)
        where = f"tile q[{q0},{q1}) kv[{k0},{k1}) env={env}"
        assert got == want or (got == "partial" and not exact), f"{got} != {want} at {where}"
        if exact_empty:
            assert (got == "empty") == (want == "empty"), f"{got} != {want} at {where}"
        begin, end = kv_range(a, q0, q1, env)
        want_range = true_range(vis, q0, q1)
        assert 0 <= begin and end <= env["kv_len"], where
        if want_range is None:
            assert begin >= end or not exact_range, where
        else:
            assert begin <= want_range[0] and want_range[1] <= end, where
            if exact_range:
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
    "head_term": (op("<=", K, op("+", QP, b("qo_head"))), "uses qo_head"),
    "division": (op("<=", op("/", K, c(2)), QP), "uses /"),
    "modulo": (op("==", op("%", K, c(4)), c(0)), "uses %"),
    "float_compare": (op("<", ir.Cast(K, F32), p("limit", F32)), "compares f32 values"),
    "bool_param": (op("&&", p("on", BOOL), CAUSAL), "uses bool on as a condition"),
    "variable_coefficient": (op("<=", op("*", W, K), QP), "has a non-constant coefficient"),
    "quadratic": (op("<=", op("*", K, K), QP), "has a non-constant coefficient"),
    "or_with_head_term": (op("||", CAUSAL, op("<", K, b("qo_head"))), "uses qo_head"),
    "or_with_bool_param": (op("||", p("on", BOOL), CAUSAL), "uses bool on as a condition"),
    "three_not_equals": (
        op("&&", op("&&", op("!=", K, Q), op("!=", Q, c(5))), op("!=", K, c(3))),
        "has more than 4 disjuncts",
    ),
    "three_ors": (
        op(
            "&&",
            op("&&", op("||", op("<", K, W), CAUSAL), op("||", op("<", Q, W), op(">", K, c(2)))),
            op("||", op("<", K, op("+", Q, c(5))), op(">", K, p("prefix_len"))),
        ),
        "has more than 4 disjuncts",
    ),
    "five_ors": (
        op(
            "||",
            op("||", op("||", op("<", K, c(1)), op("==", K, c(3))), op("==", K, c(5))),
            op("||", op("==", K, c(7)), op("==", K, c(9))),
        ),
        "has more than 4 disjuncts",
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


# ---------------------------------------------------------------------------------------------
# Unions: disjunctions of linear conjunctions


def prefix_values(rng: random.Random, kv_len: int) -> list[int]:
    return [0, 1, kv_len - 1, kv_len, kv_len + 1, kv_len + 7, -1, rng.randint(0, kv_len)]


def test_prefix_lm_is_a_union():
    a = analyse_mask(PREFIX_LM)
    assert a.kind == "union" and len(a.terms) == 2
    assert a.describe() == (
        "union of 2: linear: 1 constraint [0*q_idx + -1*kv_idx + 1*prefix_len + -1 >= 0]; "
        "linear: 1 constraint [1*q_idx + -1*kv_idx + 1*kv_len + -1*q_len + 0 >= 0]"
    )


def test_prefix_lm_brute_force():
    # KV ranges and EMPTY are exact (each term is one unit-coefficient constraint); FULL is
    # found whenever the tile lies inside the prefix or on or below the diagonal.
    a = analyse_mask(PREFIX_LM)
    for seed in range(3):
        rng = random.Random(seed)
        for q_len, kv_len in [*SHAPES, (5, 5), (3, 12), (12, 3), (64, 64)]:
            for prefix in prefix_values(rng, kv_len):
                env = dict(random_env(rng, q_len, kv_len), prefix_len=prefix)
                check(a, PREFIX_LM, env, rng, exact=False, exact_range=True, exact_empty=True)
                shift = kv_len - q_len
                for q0, q1, k0, k1 in random_tiles(rng, q_len, kv_len, 40):
                    got = classify(a, q0, q1, k0, k1, env)
                    if k1 <= prefix or k1 - 1 <= q0 + shift:
                        assert got == "full", (q0, q1, k0, k1, env)
                    if k0 >= prefix and k0 > q1 - 1 + shift:
                        assert got == "empty", (q0, q1, k0, k1, env)


def test_prefix_lm_ranges():
    a = analyse_mask(PREFIX_LM)
    env = {"q_len": 4, "kv_len": 10, "prefix_len": 8}
    assert kv_range(a, 0, 1, env) == (0, 8)  # prefix reaches past the diagonal (q_pos 6)
    assert kv_range(a, 3, 4, env) == (0, 10)
    assert kv_range(a, 0, 1, dict(env, prefix_len=0)) == (0, 7)
    assert kv_range(a, 0, 1, dict(env, prefix_len=50)) == (0, 10)
    env = {"q_len": 10, "kv_len": 4, "prefix_len": 0}  # q_len > kv_len: early rows see nothing
    assert kv_range(a, 0, 6, env) == (0, 0)
    assert classify(a, 0, 6, 0, 4, env) == "empty"
    assert kv_range(a, 0, 6, dict(env, prefix_len=2)) == (0, 2)
    assert classify(a, 0, 6, 0, 2, dict(env, prefix_len=2)) == "full"
    assert classify(a, 0, 6, 2, 4, dict(env, prefix_len=2)) == "empty"


def test_not_equal_is_exact():
    # k - q takes every value between its extremes on a tile, so a tile that avoids the
    # diagonal lies on one side of it: FULL, EMPTY and the ranges are all exact.
    mask = op("!=", K, QP)
    a = analyse_mask(mask)
    assert a.kind == "union" and len(a.terms) == 2
    sweep(mask, exact=True, kind="union")
    sweep(op("!=", op("-", K, c(3)), Q), exact=True, kind="union")
    sweep(not_(op("==", K, QP)), exact=True, kind="union")


FOUR_TERMS = op("&&", PREFIX_LM, op("||", op("<", Q, W), op(">", K, c(2))))
UNION_MASKS = {
    # name: (mask, number of terms)
    "prefix_lm_swapped": (op("||", CAUSAL, op("<", K, p("prefix_len"))), 2),
    "de_morgan_not_and": (not_(WINDOW), 2),
    "de_morgan_not_and_not": (not_(op("&&", op(">", K, QP), not_(op("<", K, W)))), 2),
    "and_of_or": (op("&&", PREFIX_LM, op("<", op("-", QP, K), W)), 2),
    "or_and_c_right": (op("&&", op(">=", K, c(2)), op("||", op("<", K, W), op("==", K, QP))), 2),
    "prefix_and_not_equal": (op("&&", PREFIX_LM, op("!=", K, op("-", QP, c(1)))), 3),
    "four_terms": (FOUR_TERMS, 4),
    "two_not_equals": (op("&&", op("!=", K, Q), op("!=", K, op("+", Q, c(1)))), 2),
    "window_or_sink": (op("||", WINDOW, op("<", K, c(4))), 2),
    "two_windows": (
        op("||", WINDOW, op("&&", op(">=", K, op("+", QP, c(3))), op("<", K, op("+", QP, W)))),
        2,
    ),
    "flag_or_causal": (op("||", op(">", p("flag"), c(0)), CAUSAL), 2),
    "q_or_kv_band": (op("||", op("<", Q, c(2)), op("<", K, c(3))), 2),
}


@pytest.mark.parametrize("name", sorted(UNION_MASKS))
def test_unit_coefficient_unions(name):
    # Unions of unit-coefficient conjunctions: ranges are hulls of exact ranges and EMPTY
    # needs every term EMPTY, so both are exact; FULL is only conservative.
    mask, n_terms = UNION_MASKS[name]
    a = analyse_mask(mask)
    assert len(a.conjunctions) == n_terms, a.describe()
    for seed in range(3):
        rng = random.Random(seed)
        for q_len, kv_len in SHAPES:
            env = random_env(rng, q_len, kv_len)
            check(a, mask, env, rng, exact=False, exact_range=True, exact_empty=True)


def test_scaled_union_is_conservative():
    mask = op("||", op("<=", op("*", c(2), K), op("+", QP, c(3))), op(">", op("*", c(3), K), W))
    sweep(mask, exact=False, kind="union")


def test_and_of_or_distributes():
    a = analyse_mask(UNION_MASKS["and_of_or"][0])
    window = analyse_mask(op("<", op("-", QP, K), W)).constraints
    prefix, causal = (t[0] for t in analyse_mask(PREFIX_LM).terms)
    assert a.terms == ((prefix, *window), (causal, *window))


def test_four_terms_is_the_limit():
    a = analyse_mask(FOUR_TERMS)
    assert a.kind == "union" and len(a.terms) == 4
    five = op("||", FOUR_TERMS, op("<", K, c(-7)))
    assert analyse_mask(five).describe() == "opaque: has more than 4 disjuncts"


def test_infeasible_and_weaker_constraints_are_dropped():
    # (k < P || k <= q_pos) && k != q_pos - 1
    #   == k < q_pos - 1 || (k < P && k > q_pos - 1) || k == q_pos
    a = analyse_mask(UNION_MASKS["prefix_and_not_equal"][0])
    assert [len(t) for t in a.terms] == [2, 1, 2]
    # k != q && k != q + 1  ==  k < q || k > q + 1
    a = analyse_mask(UNION_MASKS["two_not_equals"][0])
    assert a == analyse_mask(op("||", op("<", K, Q), op(">", K, op("+", Q, c(1)))))


@pytest.mark.parametrize(
    "mask, same_as",
    [
        (op("||", FALSE, CAUSAL), CAUSAL),
        (op("||", CAUSAL, op("&&", CAUSAL, op("<", K, W))), CAUSAL),
        (op("||", op("&&", CAUSAL, op("<", K, W)), CAUSAL), CAUSAL),
        (op("||", CAUSAL, CAUSAL), CAUSAL),
        (op("||", CAUSAL, op(">=", QP, K)), CAUSAL),
        (op("||", TRUE, op("!=", K, QP)), TRUE),
        (op("&&", op("||", CAUSAL, FALSE), op("||", FALSE, CAUSAL)), CAUSAL),
        (op("!=", c(3), c(3)), FALSE),
        (op("!=", c(3), c(2)), TRUE),
        (op("!=", K, K), FALSE),
        (op("&&", op("!=", K, QP), FALSE), FALSE),
        (op("&&", op("!=", K, QP), CAUSAL), op("<", K, QP)),
        (op("&&", op("<", K, QP), op("<", K, op("-", QP, c(2)))), op("<", K, op("-", QP, c(2)))),
        (op("&&", op("<", K, QP), op(">", K, op("-", QP, c(1)))), FALSE),
        (op("&&", op("==", K, QP), op("!=", K, QP)), FALSE),
    ],
)
def test_unions_that_collapse(mask, same_as):
    a = analyse_mask(mask)
    assert a == analyse_mask(same_as), a.describe()
    sweep(mask, exact=True, seeds=1)


def test_union_of_empty_terms_is_empty():
    # Both terms empty for every query with q_pos < 0 and prefix_len <= 0.
    a = analyse_mask(PREFIX_LM)
    env = {"q_len": 9, "kv_len": 3, "prefix_len": -2}
    assert kv_range(a, 0, 6, env) == (0, 0)
    assert kv_range(a, 6, 6, env) == (0, 0)
    assert classify(a, 0, 6, 0, 3, env) == "empty"
    assert classify(a, 5, 5, 0, 3, env) == "empty"


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
