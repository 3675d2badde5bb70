"""Hoisting levels: the outermost loop at which a sub-expression is known.

request (per request) < head < row (query row and head) < element (per key). Kernels
compute request-level values once per request, row-level ones once per query row.
"""

from __future__ import annotations

from attnc.compiler import ir


def level(e: ir.Expr) -> int:
    """Hoisting level of ``e`` (ir.REQUEST .. ir.ELEMENT), remembered on each node."""
    return ir.bottom_up(e, "_level", _own_level)


def _own_level(e: ir.Expr) -> int:
    if isinstance(e, ir.Builtin):
        if e.name == ir.OUTPUT_BUILTIN:
            return ir.ELEMENT
        return ir.BUILTINS[e.name][1]
    return max([ir.REQUEST] + [c.__dict__["_level"] for c in ir.children(e)])


def is_leaf(e: ir.Expr) -> bool:
    """Constants, built-ins and scalar params cost nothing to re-read."""
    return isinstance(e, (ir.Const, ir.Builtin, ir.ParamRef))


def hoistable(e: ir.Expr, below: int) -> list[ir.Expr]:
    """The largest non-leaf sub-expressions of ``e`` whose level is lower than ``below``,
    in evaluation order (children before parents, no duplicates)."""
    found: dict[ir.Expr, None] = {}
    seen: set[int] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if level(node) < below:
            if not is_leaf(node):
                found.setdefault(node)
            continue
        stack.extend(reversed(ir.children(node)))
    return list(found)
