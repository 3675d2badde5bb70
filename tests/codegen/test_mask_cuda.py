"""Rendered ``kv_range``/``classify`` bodies, compiled with g++ against
``attnc/mask_math.cuh`` into a small host program, agree with the Python implementation
on random tiles (including values near the i32 limit, where 64-bit arithmetic matters), for
linear masks and unions of linear conjunctions alike."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from tile_class_oracle import classify

from attnc.codegen.mask_cuda import (
    render_classify,
    render_kv_range,
    render_row_kv_range,
    row_interval_eligible,
)
from attnc.compiler import ir
from attnc.compiler.mask_analysis import MaskAnalysis, analyse_mask
from attnc.compiler.mask_tiles import kv_range

INCLUDE = Path(__file__).resolve().parents[2] / "attnc" / "kernels" / "include"
PARAMS = ("window", "prefix_len", "stride")
CLASSES = {0: "empty", 1: "full", 2: "partial"}

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def b(name: str) -> ir.Expr:
    return ir.Builtin(name, ir.BUILTINS[name][0])


def p(name: str) -> ir.Expr:
    return ir.ParamRef(name, ir.I32)


def c(value: int) -> ir.Expr:
    return ir.Const(value, ir.I32)


def op(name: str, x: ir.Expr, y: ir.Expr) -> ir.Expr:
    kind = ir.BOOL if name in ir.COMPARISONS or name in ir.LOGICAL else x.type
    return ir.Binary(name, x, y, kind)


def not_(x: ir.Expr) -> ir.Expr:
    return ir.Unary("not", x, ir.BOOL)


Q, QP, K = b("q_idx"), b("q_pos"), b("kv_idx")
CAUSAL = op("<=", K, QP)
WINDOW = op("&&", CAUSAL, op("<", op("-", QP, K), p("window")))
PREFIX_LM = op("||", op("<", K, p("prefix_len")), CAUSAL)
MASKS: dict[str, ir.Expr | None] = {
    "none": None,
    "causal": CAUSAL,
    "window": WINDOW,
    "prefix_lm": PREFIX_LM,
    "not_equal": op("!=", K, op("+", QP, p("stride"))),
    "de_morgan": not_(WINDOW),
    "and_of_or": op("&&", PREFIX_LM, op("<", op("-", QP, K), p("window"))),
    "four_terms": op(
        "&&", PREFIX_LM, op("||", op("<", Q, p("window")), op(">", K, op("+", Q, p("stride"))))
    ),
    "three_terms": op("&&", PREFIX_LM, op("!=", K, op("-", QP, c(1)))),
    "scaled_union": op(
        "||", op("<=", op("*", c(2), K), op("+", QP, c(3))), op(">", op("*", c(3), K), p("window"))
    ),
    "window_or_sink": op("||", WINDOW, op("<", K, op("+", p("stride"), c(4)))),
    "diagonal": op("==", K, op("-", Q, c(1))),
    "scaled": op("<=", op("*", c(2), K), op("+", QP, c(3))),
    "scaled_lower": op(">=", op("*", c(3), K), op("-", op("*", c(5), QP), p("window"))),
    "product": op("<", K, op("*", p("window"), p("stride"))),
    "gated": op("&&", op(">", p("stride"), c(0)), op(">=", Q, K)),
    "true": ir.Const(True, ir.BOOL),
    "false": ir.Const(False, ir.BOOL),
}


def render_expr(e: ir.Expr) -> str:
    """Request-level i32 IR -> C++ for the harness (params are members ``p_<name>``)."""
    if isinstance(e, ir.Const):
        return str(int(e.value))
    if isinstance(e, ir.ParamRef):
        return f"p_{e.name}"
    if isinstance(e, ir.Builtin):
        return f"r.{e.name}"
    if isinstance(e, ir.Binary) and e.op in ("+", "-", "*"):
        return f"({render_expr(e.a)} {e.op} {render_expr(e.b)})"
    if isinstance(e, ir.Unary) and e.op == "neg":
        return f"(-{render_expr(e.x)})"
    raise AssertionError(f"not request-level: {e!r}")


def functor(i: int, a: MaskAnalysis) -> str:
    fields = " ".join(f"int p_{n};" for n in PARAMS)
    return f"""
struct Mask{i} {{
  attnc::RequestInfo r; {fields}
  attnc::KvRange kv_range(int q_idx_begin, int q_idx_end) const {{
  {render_kv_range(a, render_expr)}
  }}
  attnc::TileClass classify(int q_idx0, int q_idx1, int kv0, int kv1) const {{
  {render_classify(a, render_expr)}
  }}
}};
"""


def program(analyses: list[MaskAnalysis]) -> str:
    structs = "".join(functor(i, a) for i, a in enumerate(analyses))
    cases = "".join(
        f"      case {i}: {{ Mask{i} m{{r, w, pl, st}}; out(m.kv_range(q0, q1), "
        f"m.classify(q0, q1, k0, k1)); break; }}\n"
        for i in range(len(analyses))
    )
    return f"""#include <cstdio>
#include "attnc/mask_math.cuh"
{structs}
static void out(attnc::KvRange kr, attnc::TileClass t) {{
  std::printf("%d %d %d\\n", kr.begin, kr.end, static_cast<int>(t));
}}
int main() {{
  int id, q_len, kv_len, w, pl, st, q0, q1, k0, k1;
  while (std::scanf("%d %d %d %d %d %d %d %d %d %d", &id, &q_len, &kv_len, &w, &pl, &st,
                    &q0, &q1, &k0, &k1) == 10) {{
    attnc::RequestInfo r{{0, q_len, kv_len, 4, 2, 64, 0.125f, 0, 0}};
    switch (id) {{
{cases}      default: return 2;
    }}
  }}
  return 0;
}}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> tuple[Path, list[str], list[MaskAnalysis]]:
    names = sorted(MASKS)
    analyses = [analyse_mask(MASKS[n]) for n in names]
    work = tmp_path_factory.mktemp("mask_cuda")
    src, exe = work / "harness.cpp", work / "harness"
    src.write_text(program(analyses))
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"]
    done = subprocess.run([*cmd, str(src), "-o", str(exe)], capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} {src}\n{done.stderr}"
    return exe, names, analyses


def random_case(rng: random.Random, big: bool) -> dict[str, int]:
    base = rng.randint(2_000_000_000, 2_147_000_000) if big else 0
    q_len = rng.randint(1, 40)
    kv_len = rng.randint(1, 40) + (base if rng.random() < 0.8 else 0)
    if big and rng.random() < 0.5:
        q_len += base
    q0 = rng.randrange(q_len)
    k0 = rng.randrange(kv_len)
    q1 = min(q_len, q0 + rng.randint(1, 48))
    k1 = min(kv_len, k0 + rng.randint(1, 48))
    if big:
        q0, q1 = rng.choice([(q0, q1), (max(0, q_len - 20), q_len)])
        k0, k1 = rng.choice([(k0, k1), (max(0, kv_len - 33), kv_len)])
    window = rng.choice([0, 1, rng.randint(-3, 60), 2_147_483_647 if big else 7])
    return {
        "q_len": q_len,
        "kv_len": kv_len,
        "window": window,
        "prefix_len": rng.choice([0, 1, kv_len, kv_len + 5, rng.randint(-2, kv_len)]),
        "stride": rng.randint(-4, 4),
        "q0": q0,
        "q1": q1,
        "k0": k0,
        "k1": k1,
    }


def test_masks_have_the_expected_kinds():
    kinds = {n: analyse_mask(m).kind for n, m in MASKS.items()}
    unions = {n for n, k in kinds.items() if k == "union"}
    assert unions == {
        "prefix_lm",
        "not_equal",
        "de_morgan",
        "and_of_or",
        "four_terms",
        "three_terms",
        "scaled_union",
        "window_or_sink",
    }
    assert len(analyse_mask(MASKS["four_terms"]).terms) == 4
    assert "opaque" not in kinds.values()


def test_rendered_functions_match_python(harness):
    exe, names, analyses = harness
    rng = random.Random(7)
    rows, want = [], []
    for _ in range(8000):
        i = rng.randrange(len(names))
        case = random_case(rng, big=rng.random() < 0.3 and names[i] != "product")
        rows.append(
            " ".join(str(v) for v in [i, case["q_len"], case["kv_len"]])
            + " "
            + " ".join(str(case[n]) for n in (*PARAMS, "q0", "q1", "k0", "k1"))
        )
        a = analyses[i]
        want.append(
            (
                *kv_range(a, case["q0"], case["q1"], case),
                classify(a, case["q0"], case["q1"], case["k0"], case["k1"], case),
            )
        )
    done = subprocess.run([str(exe)], input="\n".join(rows) + "\n", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")[:-1]
    assert len(lines) == len(rows)
    for row, line, expected in zip(rows, lines, want, strict=True):
        begin, end, cls = (int(x) for x in line.split())
        assert (begin, end, CLASSES[cls]) == expected, f"{names[int(row.split()[0])]}: {row}"


def test_bodies_end_with_return():
    for mask in MASKS.values():
        a = analyse_mask(mask)
        for body in (render_kv_range(a, render_expr), render_classify(a, render_expr)):
            assert body.rstrip().endswith(";") and "return " in body.splitlines()[-1]


def test_causal_body_text():
    body = render_kv_range(analyse_mask(CAUSAL), render_expr)
    assert body == (
        "const attnc::LinearConstraint cons[1] = {\n"
        "      {1LL, -1LL, 0LL + 1LL * static_cast<long long>(r.kv_len)"
        " + -1LL * static_cast<long long>(r.q_len)},\n"
        "  };\n"
        "  return attnc::linear_kv_range<1>(cons, q_idx_begin, q_idx_end, r.kv_len);"
    )


def test_prefix_lm_union_body_text():
    a = analyse_mask(PREFIX_LM)
    body = render_classify(a, render_expr)
    assert body == (
        "const attnc::LinearConstraint cons[2] = {\n"
        "      {0LL, -1LL, -1LL + 1LL * static_cast<long long>(p_prefix_len)},\n"
        "      {1LL, -1LL, 0LL + 1LL * static_cast<long long>(r.kv_len)"
        " + -1LL * static_cast<long long>(r.q_len)},\n"
        "  };\n"
        "  return attnc::linear_union_classify<1, 1>(cons, q_idx0, q_idx1, kv0, kv1);"
    )
    assert render_kv_range(a, render_expr).endswith(
        "  return attnc::linear_union_kv_range<1, 1>(cons, q_idx_begin, q_idx_end, r.kv_len);"
    )


def row_program(names: list[str], analyses: list[MaskAnalysis]) -> str:
    """A harness of the generated row_kv_range of each mask (one struct per mask)."""
    fields = " ".join(f"int p_{n};" for n in PARAMS)
    structs = "".join(
        f"""
struct RowMask{i} {{
  struct Row {{ int q_idx; }};
  attnc::RequestInfo r; {fields}
  attnc::KvRange row_kv_range(const Row& row) const {{
  {render_row_kv_range(a, render_expr)}
  }}
}};
"""
        for i, a in enumerate(analyses)
    )
    cases = "".join(
        f"      case {i}: {{ RowMask{i} m{{r, w, pl, st}}; kr = m.row_kv_range({{q}}); break; }}\n"
        for i in range(len(analyses))
    )
    return f"""#include <cstdio>
#include "attnc/mask_math.cuh"
{structs}
int main() {{
  int id, q_len, kv_len, w, pl, st, q;
  while (std::scanf("%d %d %d %d %d %d %d", &id, &q_len, &kv_len, &w, &pl, &st, &q) == 7) {{
    attnc::RequestInfo r{{0, q_len, kv_len, 4, 2, 64, 0.125f, 0, 0}};
    attnc::KvRange kr{{0, 0}};
    switch (id) {{
{cases}      default: return 2;
    }}
    std::printf("%d %d\\n", kr.begin, kr.end);
  }}
  return 0;
}}
"""


def test_row_interval_is_the_mask_exactly(tmp_path):
    """For every mask that is one linear conjunction (coefficients other than 1 included), the
    generated row_kv_range of a query is exactly the keys the mask shows it: kernels test that
    interval instead of the mask on PARTIAL tiles."""
    from attnc.compiler.evaluate import evaluate

    names = [n for n in sorted(MASKS) if MASKS[n] is not None]
    names = [n for n in names if row_interval_eligible(analyse_mask(MASKS[n]))]
    assert {"causal", "window", "diagonal", "gated", "false"} <= set(names)
    # 2 * kv_idx wraps in i32 past 2**30 keys (the runtime takes 2**31 - 2**16): the mask is
    # then no interval of the int64 key, and keeps its wrap guard
    assert "scaled" not in names and analyse_mask(MASKS["scaled"]).wrap_guards
    # unions, no constraints, i32 that may wrap (scaled_lower, product): the mask is tested
    assert not {"prefix_lm", "not_equal", "true", "scaled_lower", "product"} & set(names)
    analyses = [analyse_mask(MASKS[n]) for n in names]
    src, exe = tmp_path / "rows.cpp", tmp_path / "rows"
    src.write_text(row_program(names, analyses))
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"]
    done = subprocess.run([*cmd, str(src), "-o", str(exe)], capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} {src}\n{done.stderr}"
    rng = random.Random(11)
    rows, want = [], []
    for _ in range(3000):
        i = rng.randrange(len(names))
        case = random_case(rng, big=False)
        q = rng.randrange(case["q_len"])
        rows.append(
            f"{i} {case['q_len']} {case['kv_len']} "
            + " ".join(str(case[n]) for n in PARAMS)
            + f" {q}"
        )
        env = {**{n: case[n] for n in PARAMS}, "q_len": case["q_len"], "kv_len": case["kv_len"]}
        env.update(q_idx=q, q_pos=q + case["kv_len"] - case["q_len"])
        seen = [k for k in range(case["kv_len"]) if evaluate(MASKS[names[i]], {**env, "kv_idx": k})]
        want.append((seen[0], seen[-1] + 1) if seen else (0, 0))
        assert not seen or seen == list(range(seen[0], seen[-1] + 1))  # an interval indeed
    done = subprocess.run([str(exe)], input="\n".join(rows) + "\n", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = [tuple(int(x) for x in line.split()) for line in done.stdout.splitlines()]
    for row, g, w in zip(rows, got, want, strict=True):
        assert g == w, f"{names[int(row.split()[0])]}: {row}: got {g}, mask {w}"
