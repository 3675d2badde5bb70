"""Owns: what a guard is (``guarded_children``: a ?: branch and the right side of && / ||,
which the kernels evaluate only where the guard selects them), which nodes of an expression
sit under one (``guard_walk``), and which shared sub-expressions that read a tensor a
function body always evaluates.

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

from collections.abc import Callable, Iterator

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


def guarded_children(e: ir.Expr) -> tuple[tuple[ir.Expr, bool], ...]:
    """``e``'s children, each with whether the kernels evaluate it only under a guard (the
    branches of ``?:``, the right side of ``&&``/``||``)."""
    if isinstance(e, ir.Select):
        return ((e.cond, False), (e.a, True), (e.b, True))
    if isinstance(e, ir.Binary) and e.op in ir.LOGICAL:
        return ((e.a, False), (e.b, True))
    return tuple((c, False) for c in ir.children(e))


def _always(node: ir.Expr, binds: set[int], seen: dict[int, frozenset[int]]) -> frozenset[int]:
    kids = guarded_children(node)
    found = _NONE.union(*(seen[id(c)] for c, guarded in kids if not guarded))
    if isinstance(node, ir.Select):  # one of the two guarded branches always runs
        found |= seen[id(node.a)] & seen[id(node.b)]
    return found | {id(node)} if id(node) in binds else found


def guard_walk(
    e: ir.Expr, descend: Callable[[ir.Expr, bool], bool] = lambda node, guarded: True
) -> Iterator[tuple[ir.Expr, bool]]:
    """Every (node, guarded) of ``e`` once, in source order: ``guarded`` when the node is
    reached through a ?: branch or the right side of && / ||. ``descend(node, guarded)``
    False stops the walk below that node."""
    seen: set[tuple[int, bool]] = set()
    stack: list[tuple[ir.Expr, bool]] = [(e, False)]
    while stack:
        node, guarded = stack.pop()
        if (id(node), guarded) in seen:
            continue
        seen.add((id(node), guarded))
        yield node, guarded
        if not descend(node, guarded):
            continue
        kids = guarded_children(node)
        stack.extend((c, guarded or under) for c, under in reversed(kids))
