"""Owns: which shared sub-expressions that read a tensor a function body always evaluates.

A shared sub-expression gets one local constant at the top of its body. When it reads a
tensor and sits under a guard (a ?: arm, the right side of && / ||), computing it there runs
a read the guard may exist to prevent: its index may be in bounds only where the guard holds.
Such a node is bound with every read bounds-checked (``CudaText(checked_reads=True)``:
``attnc::vm::load_in_shape_`` gives 0 outside the declared shape). Its value is used only
where its guards hold, and there every index is in bounds, so it is the plain read's. A node
the body always evaluates (reached without crossing a guard, or through both arms of a ?:)
is bound with plain reads: it runs anyway. Each shared node is then text once per body, however
many guarded places use it, so a chain of lets stays linear in size.
"""

from __future__ import annotations

from attnc.compiler import ir

_NONE: frozenset[int] = frozenset()


def always_evaluated(
    nodes: list[ir.Expr], binds: set[int], hoisted: dict[ir.Expr, str]
) -> frozenset[int]:
    """The ids in ``binds`` that the last node of ``nodes`` (a postorder; the root last)
    always evaluates; nodes in ``hoisted`` are computed elsewhere and evaluate nothing here."""
    seen: dict[int, frozenset[int]] = {}
    for node in nodes:
        seen[id(node)] = _NONE if node in hoisted else _always(node, binds, seen)
    return seen[id(nodes[-1])]


def _always(node: ir.Expr, binds: set[int], seen: dict[int, frozenset[int]]) -> frozenset[int]:
    if isinstance(node, ir.Select):
        found = seen[id(node.cond)] | (seen[id(node.a)] & seen[id(node.b)])
    elif isinstance(node, ir.Binary) and node.op in ir.LOGICAL:
        found = seen[id(node.a)]
    else:
        found = _NONE.union(*(seen[id(c)] for c in ir.children(node)))
    return found | {id(node)} if id(node) in binds else found
