"""Evaluate IR expressions on Python scalars with the language's number semantics: i32
arithmetic wraps (two's complement), i32 division and modulo truncate like C, and every f32
result is rounded to binary32 (IEEE inf and nan included), as the kernels compute it.

Used by tests (random evaluation proves passes preserve meaning) and by mask analysis'
brute-force checks. ``env`` maps built-in and scalar param names to values; ``tensors`` maps
tensor param names to nested lists or arrays; a read outside a tensor's shape gives 0, as in
the kernels and the reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from attnc.compiler import ir
from attnc.compiler.numeric import I32_MAX, I32_MIN, round_f32, wrap_i32
from attnc.dsl.limits import deep_recursion

_BINARY32: ContextVar[bool] = ContextVar("binary32", default=False)
# id(node) -> (node, value) during one evaluation: a shared sub-expression is computed once.
_MEMO: ContextVar[dict[int, tuple[ir.Expr, Any]]] = ContextVar("evaluate_memo")


def _c_div(a: int, b: int) -> int:
    """i32 division of the language: truncation toward zero, x / 0 == 0."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    """i32 remainder: sign of the dividend, x % 0 == x."""
    if b == 0:
        return a
    return a - _c_div(a, b) * b


def _float_div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _c_min(a, b):
    """``a < b ? a : b`` (the kernels' min, NaN included)."""
    return a if a < b else b


def _c_max(a, b):
    """``a > b ? a : b`` (the kernels' max, NaN included)."""
    return a if a > b else b


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _inv1p_exp2(y: float) -> float:
    """1 / (1 + 2^y) (score_raw's form of the sigmoid), without overflow."""
    if y <= 0:
        return 1.0 / (1.0 + 2.0**y)
    e = 2.0 ** (-y)
    return e / (1.0 + e)


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _overflow_to_inf(fn):
    """``fn`` (an exponential, growing with x) with Python's OverflowError read as ``inf``,
    as IEEE arithmetic gives it."""

    def call(x: float) -> float:
        try:
            return fn(x)
        except OverflowError:
            return math.inf

    return call


def _log(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.log(x) if x > 0 else math.nan


def _log2(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.log2(x) if x > 0 else math.nan


def to_i32(x: float) -> int:
    """``int(x)`` of the language: toward zero, saturated to the i32 range, NaN gives 0 (as
    the kernels' ``attnc::vm::to_i32_``)."""
    if math.isnan(x):
        return 0
    if x >= 2.0**31:
        return I32_MAX
    if x <= -(2.0**31):
        return I32_MIN
    return int(x)


def _keep_zero_sign(rounded: float, x: float) -> float:
    """A floor or ceil that is 0 has the sign of ``x``, as IEEE's (ceil(-0.5) is -0.0)."""
    return math.copysign(0.0, x) if rounded == 0.0 else rounded


MATH = {
    "tanh": math.tanh,
    "exp": _overflow_to_inf(math.exp),
    "exp2": _overflow_to_inf(lambda x: 2.0**x),
    "log": _log,
    "log2": _log2,
    "sqrt": lambda x: math.sqrt(x) if x >= 0 else math.nan,
    "rsqrt": lambda x: _float_div(1.0, math.sqrt(x)) if x >= 0 else math.nan,  # -0 -> -inf
    "sigmoid": _sigmoid,
    "inv1p_exp2": _inv1p_exp2,  # written by the compiler only (score_raw)
    "softplus": _softplus,
    "floor": lambda x: _keep_zero_sign(float(math.floor(x)), x) if math.isfinite(x) else x,
    "ceil": lambda x: _keep_zero_sign(float(math.ceil(x)), x) if math.isfinite(x) else x,
}


def evaluate(
    e: ir.Expr,
    env: Mapping[str, Any],
    tensors: Mapping[str, Any] | None = None,
    *,
    binary32: bool = False,
):
    """Value of ``e``: int for i32 (wrapped to 32 bits), float for f32, bool for bool.

    With ``binary32`` every f32 result is rounded to binary32 as the kernels compute it
    (constant folding); without it f32 is computed in double precision (the exact reference
    that tests compare passes against).
    """
    token = _BINARY32.set(binary32)
    memo_token = _MEMO.set({})
    try:
        with deep_recursion():
            return _value(e, env, tensors or {})
    finally:
        _MEMO.reset(memo_token)
        _BINARY32.reset(token)


def _value(e: ir.Expr, env: Mapping[str, Any], tensors: Mapping[str, Any]):
    memo = _MEMO.get()
    found = memo.get(id(e))
    if found is not None:
        return found[1]
    value = _evaluate(e, env, tensors)
    if e.type == ir.F32:
        value = round_f32(value) if _BINARY32.get() else float(value)
    elif e.type == ir.I32:
        value = wrap_i32(value)
    memo[id(e)] = (e, value)
    return value


def _evaluate(e: ir.Expr, env: Mapping[str, Any], tensors: Mapping[str, Any]):
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, (ir.Builtin, ir.ParamRef)):
        return env[e.name]
    if isinstance(e, ir.TensorLoad):
        idx = tuple(int(_value(i, env, tensors)) for i in e.indices)
        value = tensors[e.name]
        for i in idx:
            if not 0 <= i < len(value):  # outside the shape (q_pos before the KV too): 0
                return 0.0 if e.type == ir.F32 else 0
            value = value[i]
        return float(value) if e.type == ir.F32 else int(value)
    if isinstance(e, ir.Unary):
        x = _value(e.x, env, tensors)
        return (not x) if e.op == "not" else -x
    if isinstance(e, ir.Binary):
        return _binary(e, env, tensors)
    if isinstance(e, ir.Select):
        c = _value(e.cond, env, tensors)
        return _value(e.a if c else e.b, env, tensors)
    if isinstance(e, ir.Cast):
        x = _value(e.x, env, tensors)
        if e.type == ir.F32:
            return float(x)
        if e.type == ir.BOOL:
            return bool(x)
        return to_i32(x) if isinstance(x, float) else int(x)
    if isinstance(e, ir.Call):
        args = [_value(a, env, tensors) for a in e.args]
        return _call(e, args)
    raise TypeError(f"not an IR expression: {e!r}")


def _binary(e: ir.Binary, env, tensors):
    if e.op == "&&":
        return bool(_value(e.a, env, tensors)) and bool(_value(e.b, env, tensors))
    if e.op == "||":
        return bool(_value(e.a, env, tensors)) or bool(_value(e.b, env, tensors))
    a = _value(e.a, env, tensors)
    b = _value(e.b, env, tensors)
    op = e.op
    if op in ir.COMPARISONS:
        return {
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
            "==": a == b,
            "!=": a != b,
        }[op]
    is_int = e.type == ir.I32
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return _c_div(a, b) if is_int else _float_div(a, b)
    if op == "%":
        if is_int:
            return _c_mod(a, b)
        if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
            return math.nan
        return math.fmod(a, b)
    raise TypeError(f"unknown operator {op}")


def _call(e: ir.Call, args):
    fn = e.fn
    if fn == "abs":
        return abs(args[0])
    if fn == "min":
        return _c_min(args[0], args[1])
    if fn == "max":
        return _c_max(args[0], args[1])
    if fn == "clamp":
        return _c_min(_c_max(args[0], args[1]), args[2])
    return MATH[fn](float(args[0]))
