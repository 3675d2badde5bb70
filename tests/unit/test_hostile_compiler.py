"""Hostile `.attn` programs against the compiler: constant folding, simplification and mask
analysis keep the meaning docs/language.md gives (i32 wrapping, IEEE inf and nan), checked
against the evaluator on the unsimplified IR or against brute force over small tiles."""

from __future__ import annotations

import math
import re
import time

import pytest
from tile_class_oracle import classify

from attnc.codegen.cuda_expr import CudaContext, render
from attnc.codegen.functor import emit_functor
from attnc.compiler import ir, mask_tiles
from attnc.compiler.evaluate import evaluate
from attnc.compiler.ir_printer import format_ir
from attnc.compiler.mask_analysis import LinearConstraint, analyse_mask
from attnc.compiler.mask_int64 import analysis_fits, conjunction_fits
from attnc.compiler.pipeline import Compiled, compile_source
from attnc.dsl.errors import AttnError

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)


def compiled(body: str, file: str = "h.attn") -> Compiled:
    """The one variant of ``variant v { body }`` through every pass."""
    variants, _ = compile_source("variant v {\n" + body + "\n}\n", file)
    return variants[0]


def visible_pairs(c: Compiled, env: dict[str, int]) -> list[list[bool]]:
    """vis[q][k] of the unsimplified mask over one request (brute force)."""
    q_len, kv_len = env["q_len"], env["kv_len"]
    rows = []
    for q in range(q_len):
        at = dict(env, q_idx=q, q_pos=q + kv_len - q_len)
        rows.append([bool(evaluate(c.lowered.mask, dict(at, kv_idx=k))) for k in range(kv_len)])
    return rows


def assert_tiles_keep_every_visible_key(c: Compiled, env: dict[str, int]) -> None:
    """No tile holding a visible pair is EMPTY, no tile holding a masked pair is FULL, and
    every query range's KV range covers its visible keys."""
    vis = visible_pairs(c, env)
    q_len, kv_len = env["q_len"], env["kv_len"]
    for q0 in range(q_len):
        for q1 in range(q0 + 1, q_len + 1):
            keys = [k for q in range(q0, q1) for k in range(kv_len) if vis[q][k]]
            begin, end = mask_tiles.kv_range(c.mask_analysis, q0, q1, env)
            assert not keys or (begin <= min(keys) and max(keys) < end), (q0, q1, begin, end)
            for k0 in range(kv_len):
                for k1 in range(k0 + 1, kv_len + 1):
                    cells = [vis[q][k] for q in range(q0, q1) for k in range(k0, k1)]
                    found = classify(c.mask_analysis, q0, q1, k0, k1, env)
                    assert found != "empty" or not any(cells), (q0, q1, k0, k1)
                    assert found != "full" or all(cells), (q0, q1, k0, k1)


@pytest.mark.parametrize(
    ("mask", "n"),
    [
        ("n + 1 < n", I32_MAX),  # n + 1 wraps to INT_MIN: true for every pair
        ("abs(n) < 0", I32_MIN),  # abs(INT_MIN) is INT_MIN
        ("-n < 0 && n < 0", I32_MIN),
    ],
)
def test_mask_false_in_exact_arithmetic_but_true_where_i32_wraps(mask: str, n: int) -> None:
    c = compiled(f"param n: i32; mask = {mask};")
    env = {"q_len": 3, "kv_len": 4, "n": n}
    assert all(all(row) for row in visible_pairs(c, env))
    assert_tiles_keep_every_visible_key(c, env)


def score_values(c: Compiled, score: float) -> tuple[float, float]:
    """The unsimplified and the optimised score at ``score`` (binary32, as the kernels)."""
    env = {"score": score, "c": 2.0}
    before = evaluate(c.lowered.score, env, binary32=True)
    return before, evaluate(c.variant.score, env, binary32=True)


@pytest.mark.parametrize(
    "body",
    [
        "let inf = 3.0e38 * 10.0; score = score + inf - inf;",
        "let nan = 0.0 / (1.0 - 1.0); score = score + nan - nan;",
        "let inf = 3.0e38 * 10.0; score = score * inf - score * inf;",
        "let inf = 3.0e38 * 10.0; score = (score + inf) * 0.0;",
        "let inf = 3.0e38 * 10.0; score = exp(score) * inf / inf;",
        "param c: f32; let inf = 3.0e38 * 10.0; score = score + c * inf - inf * c;",
    ],
)
def test_inf_and_nan_constants_are_not_cancelled_by_the_simplifier(body: str) -> None:
    c = compiled(body)
    before, after = score_values(c, 1.5)
    assert math.isnan(before)
    assert math.isnan(after), format_ir(c.variant.score)


def test_affine_score_keeps_an_infinite_scale_apart() -> None:
    c = compiled("let inf = 3.0e38 * 10.0; score = score * inf - score * inf;")
    assert c.affine is None or not (
        isinstance(c.affine.scale, ir.Const) and c.affine.scale.value == 0.0
    )


def chain_of_lets(first: str, step: str, n: int) -> str:
    """``let a0 = first;`` and n lets ``a{i+1} = step`` with ``{a}`` for ``a{i}``: a DAG
    whose unfolded tree doubles with every let."""
    lets = [f"let a0 = {first};"]
    lets += [f"let a{i + 1} = {step.format(a=f'a{i}')};" for i in range(n)]
    return " ".join(lets)


def plain_hooks(text: str) -> str:
    """The functor's text without ``key_values`` and the ``*_at`` hooks: what the FA2 and
    decode kernels call. Those add one more copy of the score's or mask's part that depends on
    the key alone (computed once per key by the Hopper kernel), in its size."""
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if re.match(r"  ATTNC_HD \w+ (key_values|\w+_at)\(", line):
            skipping = True
        elif skipping and line == "  }\n":
            skipping = False
            continue
        if not skipping:
            kept.append(line)
    return "".join(kept)


@pytest.mark.parametrize(
    ("first", "step", "score"),
    [
        ("float(q_idx) * 0.1", "{a} * (1.0 - {a})", "score + a18"),  # a row-level bias
        ("float(kv_idx) * 0.1", "{a} * (1.0 - {a})", "score * 2.0 + a18"),  # element level
        ("score", "{a} * {a} + {a}", "a18"),  # not affine
    ],
)
def test_affine_analysis_of_a_shared_dag_takes_linear_time(
    first: str, step: str, score: str
) -> None:
    body = chain_of_lets(first, step, 18) + f" score = {score};"
    start = time.perf_counter()
    c = compiled(body)
    seconds = time.perf_counter() - start
    assert seconds < 3.0  # exponential in the number of lets before (~2 minutes)
    if first == "score":
        assert c.affine is None
        return
    assert c.affine is not None
    env = {"q_idx": 3, "kv_idx": 5, "score": 0.25}
    scale, bias = (evaluate(x, env) for x in (c.affine.scale, c.affine.bias))
    assert 0.0 < bias < 1.0
    assert scale * 0.25 + bias == pytest.approx(evaluate(c.lowered.score, env), rel=1e-6)


def lowering_error(text: str) -> str:
    """The first line of the located error that compiling ``text`` raises."""
    with pytest.raises(AttnError) as caught:
        compile_source(text, "h.attn")
    return str(caught.value).splitlines()[0]


def def_chain(n: int, prefix: str = "") -> str:
    """``def g0(x) = x;`` and ``def gi(x) = {prefix}g{i-1}(x);`` up to ``gn``, line i + 1."""
    lines = ["def g0(x) = x;"] + [f"def g{i}(x) = {prefix}g{i - 1}(x);" for i in range(1, n + 1)]
    return "\n".join(lines) + f"\nvariant v {{ score = g{n}(score); }}\n"


def test_a_chain_of_thousands_of_defs_is_a_located_error() -> None:
    # g2500 .. g501 are 2000 nested calls; the call of g500 in g501's body is one too many.
    assert lowering_error(def_chain(2500)) == (
        "h.attn:502:15: error: def calls nested too deeply (more than 2000 levels, the limit)"
    )


@pytest.mark.parametrize("op", ["-", "+"])
def test_deep_def_bodies_calling_each_other_are_a_located_error(op: str) -> None:
    # Each body nests 1500 levels around the next call: the 2001st level is the 501st
    # operator of g19's body (line 20, column 13 + 501).
    assert lowering_error(def_chain(20, op * 1500)) == (
        "h.attn:20:514: error: expression (after substituting lets and defs) nested too "
        "deeply (more than 2000 levels, the limit)"
    )


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("int(3.0e38 * 10.0)", "h.attn:2:23: error: inf converted to i32 is outside the i32 range"),
        (
            "int(1.0e30 * 10.0)",
            "h.attn:2:23: error: 9.999999848243207e+30 converted to i32 is outside the i32 range",
        ),
        (
            "int(2147483647.0 + 1.0)",
            "h.attn:2:23: error: 2147483648.0 converted to i32 is outside the i32 range",
        ),
        ("int(0.0 / (1.0 - 1.0))", "h.attn:2:23: error: nan converted to i32 is not a number"),
    ],
)
def test_constant_converted_to_i32_out_of_range_is_an_error(expr: str, message: str) -> None:
    # As for a literal (int(1.0e30)): the kernels' and the reference's conversions differ.
    assert lowering_error(f"variant v {{\n    score = float({expr}) + score;\n}}\n") == message


def test_f32_remainder_is_rendered_as_fmodf() -> None:
    # The kernels' functor spelled it `(s % 2.0f)`, which C++ rejects for floats; the
    # reference and the evaluator compute C's fmod.
    c = compiled("param c: f32 = 0.5; score = score % 2.0 + float(kv_idx) % c;")
    text = render(c.variant.score, CudaContext({"score": "s", "kv_idx": "kv_idx"}))
    assert "%" not in text
    assert text.count("fmodf(") == 2, text
    i32 = compiled("score = score + float(kv_idx % 3);")
    assert "(kv_idx % 3)" in render(
        i32.variant.score, CudaContext({"score": "s", "kv_idx": "kv_idx"})
    )
    assert evaluate(c.variant.score, {"score": -5.5, "kv_idx": 3, "c": 0.5}) == -1.5 + 0.0


@pytest.mark.parametrize(
    ("step", "mask"),
    [
        ("min({a}, {a} + 1)", "{a} == q_pos"),  # 2^n calls through the shared lets
        ("clamp({a}, {a} - 1, {a} + 1)", "{a} <= q_pos"),
    ],
)
def test_mask_split_into_cases_has_a_budget(step: str, mask: str) -> None:
    # Every split by cases doubles the comparisons: 7 such lets took 30 s, 40 ran for hours.
    body = chain_of_lets("kv_idx", step, 40) + f" mask = {mask.format(a='a40')};"
    start = time.perf_counter()
    c = compiled(body)
    assert time.perf_counter() - start < 3.0
    assert c.mask_analysis.kind == "opaque"
    assert_tiles_keep_every_visible_key(c, {"q_len": 3, "kv_len": 4})


def test_a_sum_of_many_abs_in_a_mask_is_analysed_quickly() -> None:
    terms = " + ".join(f"abs(kv_idx - {i})" for i in range(60))
    start = time.perf_counter()
    compiled(f"mask = {terms} < 100;")
    assert time.perf_counter() - start < 3.0


DIVIDING_STEP = "{a} / 3 + {a} % 5"


@pytest.mark.parametrize(
    "body",
    [
        "mask = {a} < 5;",
        "mask = q_idx > 0 && {a} < 5;",  # the chain under a guard
        "mask = q_idx > 1 ? {a} < 5 : kv_idx <= q_pos;",
        "mask = {a} < 5 || kv_idx <= q_pos;",
        "score = score + float({a});",
    ],
)
def test_shared_lets_that_divide_are_emitted_once(body: str) -> None:
    # i32 / and % stayed in place as their unfolded tree: 3 MB of functor at 16 lets, and 30
    # lets never finished. Each let is now one local constant.
    n = 30
    start = time.perf_counter()
    c = compiled(chain_of_lets("kv_idx", DIVIDING_STEP, n) + " " + body.format(a=f"a{n}"))
    text = emit_functor(c)
    assert time.perf_counter() - start < 3.0
    assert len(text) < 12_000
    # once per function that computes it (an affine score: score() and score_bias())
    assert text.count("/ 3)") in (n, 2 * n) and text.count("% 5)") == text.count("/ 3)")


def test_shared_lets_that_read_a_tensor_are_emitted_once() -> None:
    n = 30
    step = "{a} * t[kv_idx] + {a}"
    c = compiled(
        "param t: tensor<i32>[kv_len]; " + chain_of_lets("kv_idx", step, n) + f" mask = a{n} < 5;"
    )
    full = emit_functor(c)
    text = plain_hooks(full)
    assert len(text) < 12_000 and len(full) < 3 * len(text)
    assert text.count("p.p_t[") <= n + 1


def test_linear_mask_analysis_of_a_shared_dag_takes_linear_time() -> None:
    # The linear form of each node was computed once per path: 4 minutes at 30 lets. The DAG
    # is built as IR, as the simplifier folds 'a * 3 - a * 2' to 'a' (growing coefficients,
    # such as those of 'a * 3 + a * 5', make the mask opaque: see the int64 tests below).
    a: ir.Expr = ir.Builtin("kv_idx", ir.I32)
    for _ in range(60):
        tripled = ir.Binary("*", a, ir.Const(3, ir.I32), ir.I32)
        doubled = ir.Binary("*", a, ir.Const(2, ir.I32), ir.I32)
        a = ir.Binary("-", tripled, doubled, ir.I32)
    start = time.perf_counter()
    found = analyse_mask(ir.Binary("<", a, ir.Const(5, ir.I32), ir.BOOL))
    assert time.perf_counter() - start < 3.0
    assert found.kind == "linear"
    assert found.constraints == (LinearConstraint(0, -1, (), 4),)


@pytest.mark.parametrize(
    ("first", "step", "n", "mask"),
    [
        ("kv_idx", "{a} * 3 + 1", 21, "{a} <= q_pos"),  # 3^21 * (kv_len - 1) leaves int64
        ("q_idx", "{a} * 2 + {a}", 40, "{a} + w >= 0 && {a} + s <= 0"),  # 3^40 > 2^63
        ("q_idx", "{a} * 2 + {a}", 45, "{a} + w >= 0 && {a} + s <= 0"),  # 3^45 > 2^64
        ("kv_idx", "{a} * 3 + {a} * 5", 30, "{a} < 5"),  # 8^30
        ("w", "{a} * 2 + {a}", 20, "kv_idx < {a} * s"),  # a product of request values
    ],
)
def test_mask_coefficients_past_int64_make_the_mask_opaque(
    first: str, step: str, n: int, mask: str
) -> None:
    # The constraints' coefficients were printed as `...LL` literals past the long long
    # range (nvcc rejected or truncated them) and the tile math overflowed.
    body = "param w: i32; param s: i32; " + chain_of_lets(first, step, n)
    start = time.perf_counter()
    c = compiled(body + f" mask = {mask.format(a=f'a{n}')};")
    assert time.perf_counter() - start < 3.0
    analysis = c.mask_analysis
    assert analysis.kind == "opaque"
    assert "64-bit" in analysis.reason
    for q_len, kv_len in ((1, 1), (3, 4)):
        assert_tiles_keep_every_visible_key(c, {"q_len": q_len, "kv_len": kv_len, "w": 5, "s": -5})


def test_mask_coefficients_at_the_int64_limit_stay_linear() -> None:
    # 20 lets of '* 3 + 1': every wrap check and projection still fits in int64.
    c = compiled(chain_of_lets("kv_idx", "{a} * 3 + 1", 20) + " mask = a20 <= q_pos;")
    a = c.mask_analysis
    assert a.kind == "linear" and a.wrap_guards
    assert analysis_fits([a.constraints], a.wrap_guards)
    assert max(abs(x.ck) for x in a.wrap_guards) == 3**20
    assert_tiles_keep_every_visible_key(c, {"q_len": 3, "kv_len": 4})


@pytest.mark.parametrize(
    ("cons", "fits"),
    [
        ([(1, -(3**20), -(3**20) // 2)], True),
        ([(1, -(3**21), 0)], False),  # its wrap check leaves int64
        ([(2**16, 1, 0), (-(2**16), 1, 0)], True),
        ([(2**16, 0, 2**46), (-(2**16), 0, 2**46)], False),  # each fits, not q_idx eliminated
        ([(-1, 0, 2**63 - 2**31)], False),
    ],
)
def test_conjunction_fits_bounds_every_product_of_the_tile_math(
    cons: list[tuple[int, int, int]], fits: bool
) -> None:
    assert conjunction_fits([LinearConstraint(cq, ck, (), c) for cq, ck, c in cons]) is fits


GUARDED_READ_FIRST = "t[kv_idx] + t[kv_idx]"
GUARDED_READ_STEP = "{a} * {a} + {a}"


@pytest.mark.parametrize(
    "body",
    [
        "mask = kv_idx < 16 && {a} % 3 != 1;",
        "mask = kv_idx >= 16 || {a} % 3 != 1;",
        "mask = kv_idx < 16 ? {a} % 3 != 1 : kv_idx <= q_pos;",
        "mask = kv_idx < 16 && (q_idx > 2 ? {a} % 3 != 1 : {a} % 5 != 2);",  # both arms
        "score = kv_idx < 16 ? score + float({a}) : score;",
    ],
)
def test_shared_lets_that_read_a_tensor_under_a_guard_are_emitted_once(body: str) -> None:
    # A shared tensor read under a guard stayed in place as its unfolded tree (37 MB of
    # functor at 12 lets, 2 GB at 16). It is now one local per function that computes it,
    # ahead of the guard, with its read bounds-checked (the guard may be what keeps the index
    # in bounds), and no plain read of t is left.
    n = 12
    c = compiled(
        "param t: tensor<i32>[16]; "
        + chain_of_lets(GUARDED_READ_FIRST, GUARDED_READ_STEP, n)
        + " "
        + body.format(a=f"a{n}")
    )
    full = emit_functor(c)
    text = plain_hooks(full)
    assert len(text) < 12_000 and len(full) < 3 * len(text)
    assert 1 <= text.count("attnc::vm::load_in_shape_(p.p_t, 0, kv_idx, 16)") <= 3
    assert "p.p_t[" not in full and "[&]" not in full


def test_guarded_shared_reads_grow_linearly_with_the_chain() -> None:
    sizes = []
    for n in (20, 40):
        start = time.perf_counter()
        c = compiled(
            "param t: tensor<i32>[16]; "
            + chain_of_lets(GUARDED_READ_FIRST, GUARDED_READ_STEP, n)
            + f" mask = kv_idx < 16 && a{n} % 3 != 1;"
        )
        full = emit_functor(c)
        sizes.append(len(plain_hooks(full)))
        assert time.perf_counter() - start < 3.0 and len(full) < 3 * sizes[-1]
    assert sizes[1] < 12_000 and sizes[1] - sizes[0] < sizes[0]


@pytest.mark.parametrize(
    "step",
    [
        "(kv_idx < 8 ? {a} : 1) + (kv_idx < 12 ? {a} : 2)",  # two separate ?: arms
        "(kv_idx < 8 && {a} > 3 ? 1 : 2) + (kv_idx >= 12 || {a} < 5 ? {a} : 3)",
    ],
)
def test_a_read_shared_by_separate_guards_is_emitted_once(step: str) -> None:
    # Each let uses the one before in two guarded places that no common guard evaluates: with
    # one local per guarded scope the functor doubled with every let (1.8 MB at 14 lets,
    # 29 MB at 18). Now each let is one local of the body.
    sizes = []
    for n in (18, 36):
        start = time.perf_counter()
        c = compiled(
            "param t: tensor<i32>[16]; "
            + chain_of_lets("t[kv_idx] * 2", step, n)
            + f" mask = kv_idx < 16 && a{n} % 3 != 1;"
        )
        text = emit_functor(c)
        assert time.perf_counter() - start < 3.0
        assert "p.p_t[" not in text
        sizes.append(len(text))
    assert sizes[0] < 12_000 and sizes[1] < 2.5 * sizes[0]


def test_a_read_also_evaluated_unguarded_is_bound_ahead_of_the_guards() -> None:
    # Reached unguarded (or through both arms of ?:), it runs anyway: one top-level local.
    for body in (
        "mask = {a} > 3 && (kv_idx < 16 && {a} % 3 != 1);",
        "mask = kv_idx < 16 ? {a} % 3 != 1 : {a} % 5 != 2;",
    ):
        c = compiled(
            "param t: tensor<i32>[16]; "
            + chain_of_lets("t[kv_idx % 16] + t[kv_idx % 16]", GUARDED_READ_STEP, 12)
            + " "
            + body.format(a="a12")
        )
        full = emit_functor(c)
        text = plain_hooks(full)
        assert len(text) < 12_000 and "load_in_shape_" not in text
        assert text.count("p.p_t[") == 1 and len(full) < 3 * len(text)


def test_repr_of_a_compiled_variant_with_a_deep_dag_is_short() -> None:
    # A failing test's traceback prints its arguments; the dataclass repr of a Compiled
    # unfolded the IR DAG (2^n terms for n chained lets: at 40, pytest never finished; 18
    # keeps this test's failure to a few MB).
    lets = ["let a0 = kv_idx;"] + [f"let a{i} = a{i - 1} * a{i - 1};" for i in range(1, 19)]
    text = "variant deep { " + " ".join(lets) + " mask = a18 != 3; }"
    found, _ = compile_source(text, "deep.attn")
    start = time.perf_counter()
    text = repr(found[0])
    assert time.perf_counter() - start < 1.0 and len(text) < 200, text[:200]
    assert "deep" in text
