"""Logit bound: a magnitude bound of a variant's final logit that holds for every key.

Owns the analysis that lets a kernel fix its softmax reference instead of tracking a running
row max. When every logit ``x`` of a variant satisfies ``|x| <= B`` whatever the query, key
and tensors are (soft-capping's ``cap * tanh(score / cap)`` has ``B = |cap|``), weights
``exp2(x - B)`` lie in ``[2^-2B, 1]``: for small enough ``B`` (the kernels decide how small at
launch) they need no running max, no rescale and no vote.

The bound is an f32 expression of scalar params and constants only, so the launcher can
evaluate it on the host from the call's Params. It is built bottom-up by these rules (``b(e)``
is the bound of ``e``; ``None`` means unbounded):

- a value of scalar params and constants alone (``cap``, ``log2(e) / c``): its own ``abs``,
  exact at launch (a constant folded, None when not finite);
- ``tanh``, ``sigmoid``: 1 whatever the argument; ``abs``, negation, f32 ``%``: ``b(x)``;
- ``+``, ``-``: ``b(a) + b(b)``; ``*``: ``b(a) * b(b)``; ``/`` only by a value of params and
  constants ``d``: ``b(a) / |d|`` (a zero ``d`` gives an infinite or NaN bound);
- ``min``, ``max``, ``clamp`` and selects: the sum of the bounds of the values they can
  return (a sum, not a max, so that a NaN param makes the bound NaN, which the launcher
  rejects; a max would drop it);
- ``exp``/``exp2``: ``exp(b(x))``/``exp2(b(x))``; ``softplus``: ``b(x) + ln 2``; ``sqrt``:
  ``sqrt(b(x))``; ``floor``/``ceil``: ``b(x) + 1``;
- ``score``, positions, lengths, ``sm_scale``, tensor loads and every other i32 value: None.

Bounds are magnitudes, so a value clipped on one side at a time (``min(max(score, lo), hi)``)
has none; ``clamp(score, lo, hi)`` has one.

A NaN logit is not bounded by anything, but needs no bound: it makes the row NaN with or
without a fixed reference. Pure Python on the IR: no SymPy.
"""

from __future__ import annotations

import math

from attnc.compiler import ir
from attnc.dsl.errors import Loc

__all__ = ["logit_bound"]

LN2 = math.log(2.0)
# Functions whose value lies in [-1, 1] (tanh) or (0, 1) (sigmoid) for any argument.
_UNIT_FUNCTIONS = frozenset({"tanh", "sigmoid"})
# Functions that return one of their arguments (or a NaN).
_CHOOSING_FUNCTIONS = frozenset({"min", "max"})


class _Unbounded(Exception):
    """A sub-expression has no bound over params and constants."""


def logit_bound(logit: ir.Expr | None) -> ir.Expr | None:
    """An f32 expression of scalar params and constants bounding ``|logit|`` for every row and
    key (see the module docstring), or None when the rules find none (also for an identity
    score, ``logit`` None)."""
    if logit is None or logit.type != ir.F32:
        return None
    bounds: dict[int, ir.Expr | None] = {}
    constant: dict[int, bool] = {}
    for node in ir.postorder(logit):
        constant[id(node)] = _is_launch_constant(node, constant)
        try:
            bounds[id(node)] = _own_bound(node, bounds, constant)
        except _Unbounded:
            bounds[id(node)] = None
    return bounds[id(logit)]


def _is_launch_constant(e: ir.Expr, constant: dict[int, bool]) -> bool:
    """Whether ``e`` depends on scalar params and constants only (its children known)."""
    if isinstance(e, (ir.Builtin, ir.TensorLoad)):
        return False
    return all(constant[id(c)] for c in ir.children(e))


def _own_bound(e: ir.Expr, bounds: dict[int, ir.Expr | None], constant: dict[int, bool]) -> ir.Expr:
    """The bound of ``e`` from its children's bounds (raises _Unbounded when it has none)."""
    if constant[id(e)]:
        return _constant_bound(e)
    if isinstance(e, ir.Cast) and e.type == ir.F32:
        return _child(e.x, bounds)
    if isinstance(e, ir.Unary) and e.op == "neg":
        return _child(e.x, bounds)
    if isinstance(e, ir.Binary):
        return _binary_bound(e, bounds, constant)
    if isinstance(e, ir.Select):
        return _add(_child(e.a, bounds), _child(e.b, bounds))
    if isinstance(e, ir.Call):
        return _call_bound(e, bounds)
    raise _Unbounded


def _child(e: ir.Expr, bounds: dict[int, ir.Expr | None]) -> ir.Expr:
    found = bounds.get(id(e))
    if found is None:
        raise _Unbounded
    return found


def _constant_bound(e: ir.Expr) -> ir.Expr:
    """``|e|`` of a value of params and constants: folded for a constant, else ``abs(e)``
    (an i32 value cast to f32 first, so INT_MIN keeps its magnitude)."""
    if e.type == ir.BOOL:
        raise _Unbounded  # only read by conditions
    if isinstance(e, ir.Const):
        return _folded(abs(float(e.value)), e.loc)
    as_f32 = e if e.type == ir.F32 else ir.Cast(e, ir.F32, loc=e.loc)
    return ir.Call("abs", (as_f32,), ir.F32, loc=e.loc)


def _binary_bound(
    e: ir.Binary, bounds: dict[int, ir.Expr | None], constant: dict[int, bool]
) -> ir.Expr:
    if e.type != ir.F32:
        raise _Unbounded
    a = _child(e.a, bounds)
    if e.op == "%":  # fmodf: |fmod(a, b)| <= |a|
        return a
    if e.op == "/":
        if not constant[id(e.b)]:
            raise _Unbounded
        return _div(a, _constant_bound(e.b))
    b = _child(e.b, bounds)
    if e.op in ("+", "-"):
        return _add(a, b)
    if e.op == "*":
        return _mul(a, b)
    raise _Unbounded


def _call_bound(e: ir.Call, bounds: dict[int, ir.Expr | None]) -> ir.Expr:
    if e.type != ir.F32:
        raise _Unbounded
    if e.fn in _UNIT_FUNCTIONS:
        return ir.Const(1.0, ir.F32, loc=e.loc)
    if e.fn in _CHOOSING_FUNCTIONS:
        return _add(_child(e.args[0], bounds), _child(e.args[1], bounds))
    if e.fn == "clamp":  # min(max(x, lo), hi) returns x only inside [lo, hi]
        return _add(_child(e.args[1], bounds), _child(e.args[2], bounds))
    if e.fn in ("abs", "float"):
        return _child(e.args[0], bounds)
    x = _child(e.args[0], bounds)
    if e.fn in ("exp", "exp2", "sqrt"):
        return ir.Call(e.fn, (x,), ir.F32, loc=e.loc)
    if e.fn == "softplus":
        return _add(x, ir.Const(LN2, ir.F32, loc=e.loc))
    if e.fn in ("floor", "ceil"):
        return _add(x, ir.Const(1.0, ir.F32, loc=e.loc))
    raise _Unbounded


def _div(a: ir.Expr, d: ir.Expr) -> ir.Expr:
    if isinstance(d, ir.Const):
        if float(d.value) == 0.0:
            raise _Unbounded
        return _mul(a, _folded(1.0 / float(d.value), d.loc))
    return ir.Binary("/", a, d, ir.F32, loc=a.loc)


def _is_const(e: ir.Expr, value: float) -> bool:
    return isinstance(e, ir.Const) and float(e.value) == value


def _folded(value: float, loc: Loc) -> ir.Expr:
    if not math.isfinite(value):
        raise _Unbounded
    return ir.Const(value, ir.F32, loc=loc)


def _add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(a, ir.Const) and isinstance(b, ir.Const):
        return _folded(float(a.value) + float(b.value), a.loc)
    if _is_const(a, 0.0):
        return b
    if _is_const(b, 0.0):
        return a
    return ir.Binary("+", a, b, ir.F32, loc=a.loc)


def _mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(a, ir.Const) and isinstance(b, ir.Const):
        return _folded(float(a.value) * float(b.value), a.loc)
    if _is_const(a, 1.0):
        return b
    if _is_const(b, 1.0):
        return a
    return ir.Binary("*", a, b, ir.F32, loc=a.loc)
