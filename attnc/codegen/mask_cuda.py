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


def _render_union(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """The flattened constraints of a union's terms, then ``counts`` (constraints per term)."""
    flat = tuple(x for t in analysis.terms for x in t)
    counts = ", ".join(str(len(t)) for t in analysis.terms)
    n = len(analysis.terms)
    return _render_constraints(flat, render_expr) + f"  const int counts[{n}] = {{{counts}}};\n"


def render_kv_range(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``KvRange kv_range(int q_idx_begin, int q_idx_end) const``."""
    kv_len = render_expr(ir.Builtin("kv_len", ir.I32))
    if analysis.kind == "union":
        n = len(analysis.terms)
        return (
            _render_union(analysis, render_expr)
            + f"  return attnc::linear_union_kv_range(cons, counts, {n}, q_idx_begin, q_idx_end, "
            f"{kv_len});"
        )
    if analysis.kind != "linear" or not analysis.constraints:
        return f"return attnc::full_kv_range(q_idx_begin, q_idx_end, {kv_len});"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis.constraints, render_expr)
        + f"  return attnc::linear_kv_range(cons, {n}, q_idx_begin, q_idx_end, {kv_len});"
    )


def render_classify(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``TileClass classify(int q_idx0, int q_idx1, int kv0, int kv1) const``."""
    if analysis.kind == "opaque":
        return "return attnc::opaque_classify(q_idx0, q_idx1, kv0, kv1);"
    if analysis.kind == "union":
        n = len(analysis.terms)
        return (
            _render_union(analysis, render_expr)
            + f"  return attnc::linear_union_classify(cons, counts, {n}, q_idx0, q_idx1, kv0, kv1);"
        )
    if analysis.kind == "none" or not analysis.constraints:
        return "return attnc::unmasked_classify(q_idx0, q_idx1, kv0, kv1);"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis.constraints, render_expr)
        + f"  return attnc::linear_classify(cons, {n}, q_idx0, q_idx1, kv0, kv1);"
    )
