"""Affine-score detection: is the score ``a * score + b`` with ``a`` known per query row?

When it is, kernels fold ``a * sm_scale * log2(e)`` into the exp2 multiplier and add ``b``
per element, instead of calling the score transform on every element.
"""

from __future__ import annotations

import sympy

from attnc.compiler import ir
from attnc.compiler.hoist import level
from attnc.compiler.results import AffineScore
from attnc.compiler.simplify import (
    ConstantOutOfRange,
    FormTooLarge,
    NonFiniteConstant,
    SympyConverter,
    shared_as_atoms,
    simplify_expr,
)

__all__ = ["AffineScore", "analyse_affine"]

SCORE = ir.Builtin("score", ir.F32)


def analyse_affine(score: ir.Expr | None) -> AffineScore | None:
    """The affine form of ``score`` or None if it is not affine in the incoming score."""
    one, zero = ir.Const(1.0, ir.F32), ir.Const(0.0, ir.F32)
    if score is None or score == SCORE:
        return AffineScore(one, zero, True)
    conv = SympyConverter()
    try:
        with shared_as_atoms(score):
            expr = conv.to_sympy(score)
    except NonFiniteConstant:  # inf or nan: SymPy's reals would cancel it (inf - inf = 0)
        return None
    score_symbols = [s for s, e in conv.leaves.items() if e == SCORE]
    if any(_contains_score(e) for e in conv.leaves.values() if e != SCORE):
        return None
    if not score_symbols:
        return AffineScore(zero, simplify_expr(score), False)
    if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    s = score_symbols[0]
    a = sympy.diff(expr, s)
    if a.has(s):
        return None
    b = expr.subs(s, 0)
    if b.has(s):
        return None
    try:
        scale = simplify_expr(conv.from_sympy(a, ir.F32, score))
        bias = simplify_expr(conv.from_sympy(b, ir.F32, score))
    except (FormTooLarge, ConstantOutOfRange):  # a power past MAX_POWER, a scale folded to inf:
        return None  # the score stays as written, per element
    if level(scale) > ir.ROW:
        return None
    identity = scale == one and bias == zero
    return AffineScore(scale, bias, identity)


def _contains_score(e: ir.Expr) -> bool:
    """Whether ``e`` reads the incoming score (remembered per node)."""
    return ir.bottom_up(e, "_reads_score", _own_reads_score)


def _own_reads_score(e: ir.Expr) -> bool:
    return e == SCORE or any(c.__dict__["_reads_score"] for c in ir.children(e))
