"""C++ bodies of the generated functor's ``kv_range`` and ``classify`` from a mask analysis
(calls into ``attnc/mask_math.cuh``)."""

from __future__ import annotations

from collections.abc import Callable

from attnc.compiler import ir
from attnc.compiler.mask_analysis import Conjunction, LinearConstraint, MaskAnalysis

RenderExpr = Callable[[ir.Expr], str]


def _render_c(con: LinearConstraint, render_expr: RenderExpr) -> str:
    out = f"{con.offset}LL"
    for c, a in con.terms:
        out += f" + {c}LL * static_cast<long long>({render_expr(a)})"
    return out


def _render_constraints(cons: Conjunction, render_expr: RenderExpr) -> str:
    rows = [f"      {{{x.cq}LL, {x.ck}LL, {_render_c(x, render_expr)}}}," for x in cons]
    n = len(rows)
    return f"const attnc::LinearConstraint cons[{n}] = {{\n" + "\n".join(rows) + "\n  };\n"


def _render_union(analysis: MaskAnalysis, render_expr: RenderExpr) -> tuple[str, str]:
    """The flattened constraints of a union's terms, and the template arguments that give
    each term's count."""
    flat = tuple(x for t in analysis.terms for x in t)
    counts = ", ".join(str(len(t)) for t in analysis.terms)
    return _render_constraints(flat, render_expr), counts


def _render_wrap_check(analysis: MaskAnalysis, render_expr: RenderExpr, answer: str) -> str:
    """``if (<some guard may leave the i32 range>) return <answer>;`` (or nothing): the
    mask's i32 arithmetic wraps there, so the tile answers are those of an opaque mask."""
    if not analysis.wrap_guards:
        return ""
    q_top = f"static_cast<long long>({render_expr(ir.Builtin('q_len', ir.I32))} - 1)"
    k_top = f"static_cast<long long>({render_expr(ir.Builtin('kv_len', ir.I32))} - 1)"
    tests = []
    for g in analysis.wrap_guards:
        c = _render_c(g, render_expr)
        low = f"({c}) + {min(g.cq, 0)}LL * {q_top} + {min(g.ck, 0)}LL * {k_top}"
        high = f"({c}) + {max(g.cq, 0)}LL * {q_top} + {max(g.ck, 0)}LL * {k_top}"
        tests.append(f"{low} < -2147483648LL || {high} > 2147483647LL")
    condition = " ||\n    ".join(tests)
    return f"if ({condition}) {{\n  {answer}  // the mask's i32 arithmetic may wrap\n}}\n"


def render_kv_range(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``KvRange kv_range(int q_idx_begin, int q_idx_end) const``."""
    kv_len = render_expr(ir.Builtin("kv_len", ir.I32))
    full = f"return attnc::full_kv_range(q_idx_begin, q_idx_end, {kv_len});"
    return _render_wrap_check(analysis, render_expr, full) + _render_kv_range(analysis, render_expr)


def _render_kv_range(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    kv_len = render_expr(ir.Builtin("kv_len", ir.I32))
    if analysis.kind == "union":
        n = len(analysis.terms)
        cons, counts = _render_union(analysis, render_expr)
        return (
            cons + f"  return attnc::linear_union_kv_range<{counts}>(cons, q_idx_begin, "
            f"q_idx_end, {kv_len});"
        )
    if analysis.kind != "linear" or not analysis.constraints:
        return f"return attnc::full_kv_range(q_idx_begin, q_idx_end, {kv_len});"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis.constraints, render_expr)
        + f"  return attnc::linear_kv_range<{n}>(cons, q_idx_begin, q_idx_end, {kv_len});"
    )


def render_classify(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``TileClass classify(int q_idx0, int q_idx1, int kv0, int kv1) const``. A mask
    that reads data is never FULL: the closed form's FULL becomes PARTIAL."""
    opaque = "return attnc::opaque_classify(q_idx0, q_idx1, kv0, kv1);"
    body = _render_classify(analysis, render_expr)
    if analysis.reads_data:
        if analysis.kind == "linear" and not analysis.constraints:
            body = opaque
        else:
            body = body.replace("return ", "const attnc::TileClass found = ", 1) + (
                "\n  return found == attnc::TileClass::kFull ? attnc::TileClass::kPartial : found;"
            )
    return _render_wrap_check(analysis, render_expr, opaque) + body


def _render_classify(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    if analysis.kind == "opaque":
        return "return attnc::opaque_classify(q_idx0, q_idx1, kv0, kv1);"
    if analysis.kind == "union":
        cons, counts = _render_union(analysis, render_expr)
        return (
            cons
            + f"  return attnc::linear_union_classify<{counts}>(cons, q_idx0, q_idx1, kv0, kv1);"
        )
    if analysis.kind == "none" or not analysis.constraints:
        return "return attnc::unmasked_classify(q_idx0, q_idx1, kv0, kv1);"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis.constraints, render_expr)
        + f"  return attnc::linear_classify<{n}>(cons, q_idx0, q_idx1, kv0, kv1);"
    )


def row_interval_eligible(analysis: MaskAnalysis) -> bool:
    """Whether the mask is exactly an interval of kv_idx for each query: one conjunction of
    linear constraints, no tensor reads (replaced by true), no i32 arithmetic that may wrap."""
    return (
        analysis.kind == "linear"
        and bool(analysis.constraints)
        and not analysis.reads_data
        and not analysis.wrap_guards
    )


def render_row_kv_range(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``KvRange row_kv_range(const Row& row) const`` (row_interval_eligible masks):
    the exact keys of the row's query."""
    kv_len = render_expr(ir.Builtin("kv_len", ir.I32))
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis.constraints, render_expr)
        + f"  return attnc::linear_row_kv_range<{n}>(cons, row.q_idx, {kv_len});"
    )
