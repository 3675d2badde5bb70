"""Owns: rewriting an i32 comparison that uses ``abs``, ``min``, ``max`` or ``clamp`` into an
equivalent ``&&``/``||`` of comparisons without that call, so mask analysis can see the
linear pieces (``abs(q_pos - kv_idx) <= w`` is the band ``q_pos - kv_idx <= w && kv_idx -
q_pos <= w``).

A call that is a whole side of ``< <= > >=`` is split exactly by monotonicity
(``max(p, q) <= y`` is ``p <= y && q <= y``, ``min(p, q) <= y`` is ``p <= y || q <= y``, and
the mirrored forms); anywhere else (inside arithmetic, or under ``==``/``!=``) the comparison
is split by cases (``max(p, q)`` is ``p`` where ``p >= q``, else ``q``).
"""

from __future__ import annotations

from dataclasses import replace

from attnc.compiler import ir

SPLITTABLE = ("abs", "min", "max", "clamp")
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _minmax(call: ir.Call) -> tuple[str, ir.Expr, ir.Expr]:
    """``call`` as ``(min|max, p, q)``: abs(x) = max(x, -x), clamp(x, lo, hi) =
    min(max(x, lo), hi)."""
    if call.fn == "abs":
        x = call.args[0]
        return "max", x, ir.Unary("neg", x, x.type, loc=call.loc)
    if call.fn == "clamp":
        x, lo, hi = call.args
        return "min", ir.Call("max", (x, lo), x.type, loc=call.loc), hi
    return call.fn, call.args[0], call.args[1]


def _is_split_call(e: ir.Expr) -> bool:
    return isinstance(e, ir.Call) and e.fn in SPLITTABLE and e.type == ir.I32


def _compare(op: str, a: ir.Expr, b: ir.Expr, loc) -> ir.Expr:
    return ir.Binary(op, a, b, ir.BOOL, loc=loc)


def _join(op: str, a: ir.Expr, b: ir.Expr, loc) -> ir.Expr:
    return ir.Binary(op, a, b, ir.BOOL, loc=loc)


def split_comparison(e: ir.Binary, op: str) -> ir.Expr | None:
    """A bool IR equal to ``e.a op e.b`` with one splittable call fewer, or None when the
    comparison has no i32 abs/min/max/clamp."""
    if e.a.type != ir.I32:
        return None
    loc = e.loc
    for side, other, side_op in ((e.a, e.b, op), (e.b, e.a, _MIRROR.get(op))):
        if side_op in _MIRROR and _is_split_call(side):
            assert isinstance(side, ir.Call)
            kind, p, q = _minmax(side)
            both = kind == "max" if side_op in ("<", "<=") else kind == "min"
            joined = "&&" if both else "||"
            return _join(
                joined, _compare(side_op, p, other, loc), _compare(side_op, q, other, loc), loc
            )
    call = next((n for n in ir.walk(e) if _is_split_call(n)), None)
    if call is None:
        return None
    assert isinstance(call, ir.Call)
    kind, p, q = _minmax(call)
    first = ">=" if kind == "max" else "<="
    second = "<" if kind == "max" else ">"
    comparison = _compare(op, e.a, e.b, loc)
    return _join(
        "||",
        _join("&&", _compare(first, p, q, loc), substitute(comparison, call, p), loc),
        _join("&&", _compare(second, p, q, loc), substitute(comparison, call, q), loc),
        loc,
    )


def substitute(e: ir.Expr, old: ir.Expr, new: ir.Expr) -> ir.Expr:
    """``e`` with every occurrence of ``old`` replaced by ``new`` (shared nodes rebuilt once)."""
    done: dict[int, ir.Expr] = {}
    for node in ir.postorder(e):
        if node == old:
            done[id(node)] = new
            continue
        kids = ir.children(node)
        if not kids or all(done[id(k)] is k for k in kids):
            done[id(node)] = node
            continue
        done[id(node)] = _with_children(node, tuple(done[id(k)] for k in kids))
    return done[id(e)]


def _with_children(node: ir.Expr, kids: tuple[ir.Expr, ...]) -> ir.Expr:
    if isinstance(node, ir.TensorLoad):
        return replace(node, indices=kids)
    if isinstance(node, (ir.Unary, ir.Cast)):
        return replace(node, x=kids[0])
    if isinstance(node, ir.Binary):
        return replace(node, a=kids[0], b=kids[1])
    if isinstance(node, ir.Select):
        return replace(node, cond=kids[0], a=kids[1], b=kids[2])
    if isinstance(node, ir.Call):
        return replace(node, args=kids)
    return node
