"""Lower AST expressions to typed IR: name resolution, type inference and checks.

Types are i32, f32 and bool. Mixed i32/f32 arithmetic promotes to f32 with an explicit
Cast. ``def`` helpers are inlined at their call sites (recursion is an error).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.numeric import I32_MAX, I32_MIN, is_finite, round_f32
from attnc.compiler.token_index import first_index_error
from attnc.dsl import ast
from attnc.dsl.errors import AttnError, Loc
from attnc.dsl.limits import MAX_IR_DEPTH, too_deep_message

INT32_MAX = I32_MAX
# What the depth limit of lowered expressions is about, in its message.
SUBSTITUTED = "expression (after substituting lets and defs)"


@dataclass
class Scope:
    """Names visible to an expression: value bindings (lets, def args), params, defs."""

    values: dict[str, ir.Expr] = field(default_factory=dict)
    tensors: dict[str, ir.ParamDecl] = field(default_factory=dict)
    defs: dict[str, ast.Def] = field(default_factory=dict)
    allow_out: bool = False
    used_params: set[str] = field(default_factory=set)
    def_stack: tuple[str, ...] = ()
    # (def name, argument nodes) -> the inlined body: a def called twice with the same
    # arguments yields one shared node, so nested defs stay a DAG, not an exponential tree.
    inlined: dict[tuple[str, tuple[ir.Expr, ...]], ir.Expr] = field(default_factory=dict)
    # How many expressions are being lowered one inside another, def bodies included (one
    # counter shared with the def scopes): past MAX_IR_DEPTH the IR is deeper than the limit.
    nesting: list[int] = field(default_factory=lambda: [0])

    def child_for_def(self, d: ast.Def, args: dict[str, ir.Expr]) -> Scope:
        """Scope of a def body: its arguments plus built-ins (no lets or params of the caller)."""
        return Scope(
            values=dict(args),
            tensors={},
            defs=self.defs,
            allow_out=False,
            used_params=self.used_params,
            def_stack=self.def_stack + (d.name,),
            inlined=self.inlined,
            nesting=self.nesting,
        )

    def visible_names(self) -> list[str]:
        """Every name an expression may use here (values, tensors, builtins), for the
        'did you mean' of an unknown-name error."""
        names = list(self.values) + list(self.tensors) + list(ir.BUILTINS)
        if self.allow_out:
            names.append(ir.OUTPUT_BUILTIN)
        return names


def suggest(name: str, candidates: list[str]) -> str:
    """`` (did you mean 'x'?)`` or an empty string."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def lower_expr(e: ast.Expr, scope: Scope) -> ir.Expr:
    """Typed IR for ``e`` in ``scope``; raises AttnError at the offending sub-expression."""
    lowerer = _LOWERERS.get(type(e))
    if lowerer is None:
        raise AttnError(getattr(e, "loc", None) or Loc("<unknown>", 0, 0), "not an expression")
    if isinstance(e, ast.Call) and e.func in scope.defs:
        return lowerer(e, scope)  # def calls have their own limit (_inline_def)
    # Every other level (but a unary plus) adds a node to the IR, so the count bounds the
    # IR's depth and keeps the recursion within Python's, def bodies included.
    nesting = scope.nesting
    if nesting[0] >= MAX_IR_DEPTH:
        raise AttnError(e.loc, too_deep_message(SUBSTITUTED, MAX_IR_DEPTH))
    nesting[0] += 1
    try:
        return lowerer(e, scope)
    finally:
        nesting[0] -= 1


def _num(e: ast.Num, scope: Scope) -> ir.Expr:
    if e.is_float:
        value = round_f32(float(e.value))
        if not is_finite(value):
            raise AttnError(e.loc, "float literal rounds to infinity in f32 (at most 3.4028235e38)")
        return ir.Const(value, ir.F32, loc=e.loc)
    if not I32_MIN <= int(e.value) <= INT32_MAX:
        raise AttnError(e.loc, f"integer literal {e.value} does not fit in i32")
    return ir.Const(int(e.value), ir.I32, loc=e.loc)


def _bool(e: ast.BoolLit, scope: Scope) -> ir.Expr:
    return ir.Const(bool(e.value), ir.BOOL, loc=e.loc)


def _name(e: ast.Name, scope: Scope) -> ir.Expr:
    if e.id in scope.values:
        value = scope.values[e.id]
        if isinstance(value, ir.ParamRef):
            scope.used_params.add(value.name)
        return _relocate(value, e.loc)
    if e.id in ir.BUILTINS:
        return ir.Builtin(e.id, ir.BUILTINS[e.id][0], loc=e.loc)
    if e.id == ir.OUTPUT_BUILTIN and scope.allow_out:
        return ir.Builtin(ir.OUTPUT_BUILTIN, ir.F32, loc=e.loc)
    if e.id == ir.OUTPUT_BUILTIN:
        raise AttnError(e.loc, "'out' can only be used in 'output = ...'")
    if e.id in scope.tensors:
        raise AttnError(e.loc, f"tensor param '{e.id}' must be indexed, e.g. {e.id}[qo_head]")
    if e.id in scope.defs:
        raise AttnError(e.loc, f"'{e.id}' is a def: call it as {e.id}(...)")
    raise AttnError(e.loc, f"unknown name '{e.id}'{suggest(e.id, scope.visible_names())}")


def _relocate(value: ir.Expr, loc: Loc) -> ir.Expr:
    # A bare param reference takes the location of its use, for messages about it.
    if isinstance(value, ir.ParamRef):
        return ir.ParamRef(value.name, value.type, loc=loc)
    return value


def _unary(e: ast.Unary, scope: Scope) -> ir.Expr:
    x = lower_expr(e.operand, scope)
    if e.op == "!":
        _expect(x, ir.BOOL, e.loc, "operand of '!'")
        return ir.Unary("not", x, ir.BOOL, loc=e.loc)
    _expect_numeric(x, e.loc, f"operand of unary '{e.op}'")
    if e.op == "+":
        return x
    return ir.Unary("neg", x, x.type, loc=e.loc)


def _binary(e: ast.Binary, scope: Scope) -> ir.Expr:
    a = lower_expr(e.left, scope)
    b = lower_expr(e.right, scope)
    op = e.op
    if op in ir.LOGICAL:
        _expect(a, ir.BOOL, e.left.loc, f"left operand of '{op}'")
        _expect(b, ir.BOOL, e.right.loc, f"right operand of '{op}'")
        return ir.Binary(op, a, b, ir.BOOL, loc=e.loc)
    if op in ("==", "!=") and a.type == ir.BOOL and b.type == ir.BOOL:
        return ir.Binary(op, a, b, ir.BOOL, loc=e.loc)
    _expect_numeric(a, e.left.loc, f"left operand of '{op}'")
    _expect_numeric(b, e.right.loc, f"right operand of '{op}'")
    if op in ("/", "%") and isinstance(b, ir.Const) and b.value == 0:
        what = "division" if op == "/" else "modulo"
        raise AttnError(e.right.loc, f"{what} by zero")
    a, b = promote(a, b)
    result = ir.BOOL if op in ir.COMPARISONS else a.type
    return ir.Binary(op, a, b, result, loc=e.loc)


def _ternary(e: ast.Ternary, scope: Scope) -> ir.Expr:
    cond = lower_expr(e.cond, scope)
    _expect(cond, ir.BOOL, e.cond.loc, "condition of '?:'")
    a = lower_expr(e.then, scope)
    b = lower_expr(e.otherwise, scope)
    if (a.type == ir.BOOL) != (b.type == ir.BOOL):
        raise AttnError(e.loc, f"branches of '?:' have incompatible types {a.type} and {b.type}")
    if a.type != ir.BOOL:
        a, b = promote(a, b)
    return ir.Select(cond, a, b, a.type, loc=e.loc)


def _index(e: ast.Index, scope: Scope) -> ir.Expr:
    decl = scope.tensors.get(e.name)
    if decl is None:
        if e.name in scope.values or e.name in ir.BUILTINS:
            raise AttnError(e.loc, f"'{e.name}' is not a tensor and cannot be indexed")
        names = list(scope.tensors)
        raise AttnError(e.loc, f"unknown tensor '{e.name}'{suggest(e.name, names)}")
    if len(e.indices) != len(decl.dims):
        raise AttnError(
            e.loc,
            f"tensor '{e.name}' has {len(decl.dims)} dimension(s) but is indexed with "
            f"{len(e.indices)} index(es)",
        )
    indices = []
    for index in e.indices:
        value = lower_expr(index, scope)
        if value.type != ir.I32:
            hint = " (use int(...) to convert)" if value.type == ir.F32 else ""
            raise AttnError(index.loc, f"tensor index must be i32, got {value.type}{hint}")
        indices.append(value)
    wrong = first_index_error(decl, indices[0])
    if wrong is not None:
        raise AttnError(e.indices[0].loc, wrong)
    scope.used_params.add(e.name)
    return ir.TensorLoad(e.name, tuple(indices), decl.dtype, loc=e.loc)


def _call(e: ast.Call, scope: Scope) -> ir.Expr:
    if e.func in scope.defs:
        return _inline_def(e, scope)
    spec = ir.FUNCTIONS.get(e.func)
    if spec is None:
        names = list(ir.FUNCTIONS) + list(scope.defs)
        raise AttnError(e.loc, f"unknown function '{e.func}'{suggest(e.func, names)}")
    arity, rule = spec
    if len(e.args) != arity:
        raise AttnError(e.loc, f"'{e.func}' takes {arity} argument(s), got {len(e.args)}")
    args = [lower_expr(a, scope) for a in e.args]
    for arg, node in zip(args, e.args, strict=True):
        _expect_numeric(arg, node.loc, f"argument of '{e.func}'")
    if rule == "to_f32":
        return cast(args[0], ir.F32)
    if rule == "to_i32":
        return cast(args[0], ir.I32)
    if rule == "float":
        args = [cast(a, ir.F32) for a in args]
    else:
        args = list(promote(*args))
    return ir.Call(e.func, tuple(args), args[0].type, loc=e.loc)


def _inline_def(e: ast.Call, scope: Scope) -> ir.Expr:
    d = scope.defs[e.func]
    if len(scope.def_stack) >= MAX_IR_DEPTH:
        raise AttnError(e.loc, too_deep_message("def calls", MAX_IR_DEPTH))
    if d.name in scope.def_stack:
        chain = " -> ".join(scope.def_stack[scope.def_stack.index(d.name) :] + (d.name,))
        raise AttnError(e.loc, f"recursive def '{d.name}' ({chain}); defs cannot recurse")
    if len(e.args) != len(d.params):
        raise AttnError(
            e.loc, f"def '{d.name}' takes {len(d.params)} argument(s), got {len(e.args)}"
        )
    args = {name: lower_expr(a, scope) for name, a in zip(d.params, e.args, strict=True)}
    key = (d.name, tuple(args.values()))
    found = scope.inlined.get(key)
    if found is None:
        found = lower_expr(d.body, scope.child_for_def(d, args))
        scope.inlined[key] = found
    return found


def promote(*xs: ir.Expr) -> tuple[ir.Expr, ...]:
    """Cast numeric operands to their common type (f32 if any is f32)."""
    target = ir.F32 if any(x.type == ir.F32 for x in xs) else ir.I32
    return tuple(cast(x, target) for x in xs)


def cast(x: ir.Expr, target: str) -> ir.Expr:
    """``x`` converted to ``target`` (a no-op when it already has that type)."""
    if x.type == target:
        return x
    if isinstance(x, ir.Const) and x.type != ir.BOOL:
        if target == ir.F32:
            return ir.Const(round_f32(float(x.value)), target, loc=x.loc)
        value = _checked_i32(float(x.value), x.loc)
        return ir.Const(value, target, loc=x.loc)
    if target == ir.I32 and not _reads_inputs(x):
        # A constant expression (int(3.0e38 * 10.0)) is checked like a literal: the kernels'
        # and the reference's conversions of inf, nan and huge values differ.
        _checked_i32(float(evaluate(x, {}, binary32=True)), x.loc)
    return ir.Cast(x, target, loc=x.loc)


def _checked_i32(value: float, loc: Loc) -> int:
    """``value`` truncated to i32; an error at ``loc`` when it has no i32 value."""
    if math.isnan(value):
        raise AttnError(loc, "nan converted to i32 is not a number")
    if not (is_finite(value) and I32_MIN <= int(value) <= I32_MAX):
        raise AttnError(loc, f"{value!r} converted to i32 is outside the i32 range")
    return int(value)


def _reads_inputs(x: ir.Expr) -> bool:
    """Whether ``x`` reads a built-in, a param or a tensor (remembered per node)."""
    return ir.bottom_up(x, "_reads_inputs", _own_reads_inputs)


def _own_reads_inputs(e: ir.Expr) -> bool:
    if isinstance(e, (ir.Builtin, ir.ParamRef, ir.TensorLoad)):
        return True
    return any(c.__dict__["_reads_inputs"] for c in ir.children(e))


def _expect(x: ir.Expr, type_: str, loc: Loc, what: str) -> None:
    if x.type != type_:
        raise AttnError(loc, f"{what} must be {type_}, got {x.type}")


def _expect_numeric(x: ir.Expr, loc: Loc, what: str) -> None:
    if x.type == ir.BOOL:
        raise AttnError(loc, f"{what} must be a number (i32 or f32), got bool")


_LOWERERS: dict[type, Callable[[Any, Scope], ir.Expr]] = {
    ast.Num: _num,
    ast.BoolLit: _bool,
    ast.Name: _name,
    ast.Unary: _unary,
    ast.Binary: _binary,
    ast.Ternary: _ternary,
    ast.Index: _index,
    ast.Call: _call,
}
