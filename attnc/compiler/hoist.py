"""Hoisting levels: the outermost loop at which a sub-expression is known.

request (per request) < head < row (query row and head) < element (per key). Kernels
compute request-level values once per request, row-level ones once per query row.
"""

from __future__ import annotations

from functools import lru_cache

from attnc.compiler import ir


@lru_cache(maxsize=4096)
def level(e: ir.Expr) -> int:
    """Hoisting level of ``e`` (ir.REQUEST .. ir.ELEMENT)."""
    if isinstance(e, ir.Builtin):
        if e.name == ir.OUTPUT_BUILTIN:
            return ir.ELEMENT
        return ir.BUILTINS[e.name][1]
    own = ir.REQUEST
    return max([own] + [level(c) for c in ir.children(e)])


def is_leaf(e: ir.Expr) -> bool:
    """Constants, built-ins and scalar params cost nothing to re-read."""
    return isinstance(e, (ir.Const, ir.Builtin, ir.ParamRef))


def hoistable(e: ir.Expr, below: int) -> list[ir.Expr]:
    """The largest non-leaf sub-expressions of ``e`` whose level is lower than ``below``,
    in evaluation order (children before parents, no duplicates)."""
    found: list[ir.Expr] = []
    _collect(e, below, found)
    return found


def _collect(e: ir.Expr, below: int, found: list[ir.Expr]) -> None:
    if level(e) < below:
        if not is_leaf(e) and e not in found:
            found.append(e)
        return
    for c in ir.children(e):
        _collect(c, below, found)
