"""Bias-step analysis: is an affine score's bias linear in ``kv_idx`` with a per-row step?

Owns the decision (and the step expression) that lets a kernel evaluate the bias ``b(row,
kv_idx)`` of an affine score once per row and tile, at the lane's first key ``kv0``, and reach
the other keys by ``b(row, kv0 + k) = b(row, kv0) + k * step(row)``. The step is a row-level
f32 expression (natural-log units, like the bias).

Only forms where stepping equals the direct evaluation up to f32 rounding are accepted:
``kv_idx`` may enter only through i32 offsets ``±kv_idx ∓ (at most one query position,
q_pos or q_idx, of the opposite sign) ± small constants``, cast to f32, then combined with
row-level f32 values by ``+``, ``-``, negation and products with one row-level factor. Those
offsets cannot overflow for any length the runtime takes (``dsl/limits.py``) and convert
exactly below 2**24, and the bias stays free of loads,
divisions and selects that depend on ``kv_idx``, so it may be evaluated at any ``int`` key
(a lane's first key may lie past a ragged tile's end). Anything else -- ``kv_idx`` under a
call, a select, a tensor index, ``/`` or ``%``, an i32 product, two ``kv_idx`` factors in one
product -- gives None, and kernels evaluate the bias per element as before.

Pure Python on the IR: no SymPy, so a cached load stays fast.
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.hoist import level
from attnc.compiler.numeric import round_f32

__all__ = ["bias_step"]

KV_IDX = ir.Builtin("kv_idx", ir.I32)
# Row-level i32 values an offset may add or subtract (bounded by the sequence lengths).
QUERY_POSITIONS = frozenset({"q_pos", "q_idx"})
# Largest magnitude of the constant part of an offset.
MAX_OFFSET_CONSTANT = 1 << 16


class _NotLinear(Exception):
    """The expression is outside the accepted forms."""


# The step of a sub-expression that does not depend on kv_idx.
_ZERO = None


def bias_step(bias: ir.Expr | None) -> ir.Expr | None:
    """d(bias)/d(kv_idx) as a row-level f32 expression when ``bias`` is an accepted linear
    form in ``kv_idx`` (see the module docstring), else None (also for a bias that does not
    depend on ``kv_idx``: it is already hoisted per row)."""
    if bias is None or bias.type != ir.F32 or level(bias) < ir.ELEMENT:
        return None
    steps: dict[int, ir.Expr | None] = {}
    try:
        for node in ir.postorder(bias):
            steps[id(node)] = _own_step(node, steps)
    except _NotLinear:
        return None
    step = steps[id(bias)]
    if step is _ZERO or level(step) > ir.ROW:
        return None
    return step


def _own_step(e: ir.Expr, steps: dict[int, ir.Expr | None]) -> ir.Expr | None:
    """The step of ``e`` from its children's steps (``_ZERO`` when free of kv_idx)."""
    if level(e) <= ir.ROW or e.type != ir.F32:
        # An i32 or bool value that depends on kv_idx is judged by its f32 consumer: only an
        # offset cast reads one (a select, call or tensor load at element level is rejected).
        return _ZERO
    if isinstance(e, ir.Cast):
        return _offset_step(e.x)
    if isinstance(e, ir.Unary) and e.op == "neg":
        return _neg(steps[id(e.x)])
    if isinstance(e, ir.Binary) and e.op in ("+", "-"):
        a, b = steps[id(e.a)], steps[id(e.b)]
        return _add(a, b) if e.op == "+" else _add(a, _neg(b))
    if isinstance(e, ir.Binary) and e.op == "*":
        return _product_step(e, steps)
    return _reject()


def _product_step(e: ir.Binary, steps: dict[int, ir.Expr | None]) -> ir.Expr | None:
    """A product with one factor free of kv_idx: that factor times the other's step."""
    a, b = steps[id(e.a)], steps[id(e.b)]
    if a is not _ZERO and b is not _ZERO:
        return _reject()
    if level(e.a if a is _ZERO else e.b) > ir.ROW:
        return _reject()
    if a is _ZERO:
        return _scale(e.a, b)
    return _scale(e.b, a)


def _offset_step(x: ir.Expr) -> ir.Expr:
    """The step (±1) of ``float(x)`` for an i32 offset ``x`` of the accepted form."""
    if x.type != ir.I32:
        return _reject()
    kv_sign, position_signs, constant = 0, [], 0
    for sign, term in _signed_terms(x):
        if term == KV_IDX:
            kv_sign += sign
        elif isinstance(term, ir.Builtin) and term.name in QUERY_POSITIONS:
            position_signs.append(sign)
        elif isinstance(term, ir.Const) and isinstance(term.value, int):
            constant += sign * term.value
        else:
            return _reject()
    if kv_sign not in (1, -1) or len(position_signs) > 1 or abs(constant) > MAX_OFFSET_CONSTANT:
        return _reject()
    if position_signs and position_signs[0] == kv_sign:
        # kv_idx + q_pos reaches about twice the longest request: it wraps past 2**30 tokens
        # (the runtime takes up to 2**31 - 2**16), where the stepped bias would not
        return _reject()
    return ir.Const(float(kv_sign), ir.F32)


def _signed_terms(x: ir.Expr) -> list[tuple[int, ir.Expr]]:
    """``x`` as a signed sum of terms through i32 ``+``, ``-``, negation and ``* ±1``."""
    out: list[tuple[int, ir.Expr]] = []
    stack = [(1, x)]
    while stack:
        sign, node = stack.pop()
        if len(out) + len(stack) > 8:  # an offset has a handful of terms
            return _reject()
        if isinstance(node, ir.Binary) and node.op in ("+", "-"):
            stack.append((sign, node.a))
            stack.append((sign if node.op == "+" else -sign, node.b))
        elif isinstance(node, ir.Unary) and node.op == "neg":
            stack.append((-sign, node.x))
        elif isinstance(node, ir.Binary) and node.op == "*" and _unit(node.a):
            stack.append((sign * _unit(node.a), node.b))
        elif isinstance(node, ir.Binary) and node.op == "*" and _unit(node.b):
            stack.append((sign * _unit(node.b), node.a))
        else:
            out.append((sign, node))
    return out


def _unit(e: ir.Expr) -> int:
    """1 or -1 for an i32 constant ±1, else 0."""
    if isinstance(e, ir.Const) and e.type == ir.I32 and e.value in (1, -1):
        return int(e.value)
    return 0


def _reject():
    raise _NotLinear


def _neg(step: ir.Expr | None) -> ir.Expr | None:
    if step is _ZERO:
        return _ZERO
    if isinstance(step, ir.Const):
        return ir.Const(-float(step.value), ir.F32)
    if isinstance(step, ir.Unary) and step.op == "neg":
        return step.x
    return ir.Unary("neg", step, ir.F32)


def _add(a: ir.Expr | None, b: ir.Expr | None) -> ir.Expr | None:
    if a is _ZERO:
        return b
    if b is _ZERO:
        return a
    if isinstance(a, ir.Const) and isinstance(b, ir.Const):
        return ir.Const(round_f32(float(a.value) + float(b.value)), ir.F32)
    return ir.Binary("+", a, b, ir.F32)


def _scale(factor: ir.Expr, step: ir.Expr | None) -> ir.Expr | None:
    """``factor * step`` (``factor`` free of kv_idx), folding unit and constant steps."""
    if step is _ZERO:
        return _ZERO
    if isinstance(step, ir.Const) and step.value == 1.0:
        return factor
    if isinstance(step, ir.Const) and step.value == -1.0:
        return _neg(factor)
    if isinstance(step, ir.Const) and isinstance(factor, ir.Const):
        return ir.Const(round_f32(float(factor.value) * float(step.value)), ir.F32)
    return ir.Binary("*", factor, step, ir.F32)
