"""Owns: the range check of the values a functor derives once per request or once per query
head from scalar params, ``sm_scale`` and the head index (its ``c<i>`` members, e.g.
soft-cap's ``sm_scale / cap`` and ``1.442695 * cap``, and the Row fields that read only
those and ``qo_head`` / ``kv_head``).

The optimiser rewrites ``cap * tanh(score * sm_scale / cap)`` so that each key costs one
multiply: exact over the reals, but in f32 the derived value can overflow or fall below the
normal range (2^-126) where the original expression would not, for extreme param values
(``cap = 1e37``): the scores would then be computed from a value flushed to 0, inf or NaN
while the reference stays finite, so such a call is refused with the param named. Values
that depend on a request's lengths or on tensor params are not checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.ir_printer import format_ir
from attnc.compiler.numeric import F32_MIN_NORMAL
from attnc.compiler.results import Compiled
from attnc.compiler.score_log2 import LOG2E, SM_SCALE

# Request-level built-ins that are the same for every request of a call.
CALL_BUILTINS = frozenset({"sm_scale", "head_dim", "num_qo_heads", "num_kv_heads"})
# Head-level built-ins: a value reading them is checked for every query head of the call.
HEAD_BUILTINS = frozenset({"qo_head", "kv_head"})


@dataclass(frozen=True)
class CheckedValue:
    """A value the kernels derive in f32 from scalar params (``checked_value_exprs``).
    ``overflow_only``: only its overflow is refused, not a subnormal value (an affine
    score's exp2 factors: a bias flushed to 0 changes no score, and a tiny scale is what
    the written score asks for)."""

    expr: ir.Expr
    overflow_only: bool = False


def checked_value_exprs(compiled: Compiled) -> tuple[CheckedValue, ...]:
    """The f32 request and row values of ``compiled``'s functor that read only scalar
    params, the built-ins in ``CALL_BUILTINS`` and the head index, and are used outside
    every guard; and, for a softmax variant's affine score that reads only those, the
    kernels' exp2 factors: ``scale * sm_scale * log2(e)`` and ``bias * log2(e)`` (a variant
    without softmax adds the bias as it is). What ``derived_value_problem`` checks."""
    from attnc.codegen.functor import unguarded_value_exprs  # Jinja: loaded on first use

    values = unguarded_value_exprs(compiled)
    found = [CheckedValue(e) for e in values if e.type == ir.F32 and _free_names(e) is not None]
    affine = compiled.affine
    if affine is not None and compiled.variant.normalize == "softmax":
        scaled = ir.Binary("*", affine.scale, SM_SCALE, ir.F32, loc=affine.scale.loc)
        for factor in (scaled, affine.bias):
            names = _free_names(factor) if factor.type == ir.F32 else None
            if names is not None and names - {"sm_scale"}:  # it reads a param or the head
                log2e = ir.Const(LOG2E, ir.F32, loc=factor.loc)
                product = ir.Binary("*", factor, log2e, ir.F32, loc=factor.loc)
                found.append(CheckedValue(product, overflow_only=True))
    return tuple(found)


def derived_value_problem(
    values: Sequence[CheckedValue],
    scalars: Mapping[str, object],
    sm_scale: float,
    heads: tuple[int, int, int],
) -> str | None:
    """Why one of ``values`` (``checked_value_exprs``), evaluated in f32 on the scalar param
    values ``scalars`` and ``sm_scale`` (``heads`` = num_qo_heads, num_kv_heads, head_dim),
    for every query head when it reads the head index, is out of range, or None when each
    is finite and 0 or normal (finite, for an overflow-only one). A value whose params
    include an inf or NaN is not checked (the user asked for it)."""
    num_qo_heads, num_kv_heads, head_dim = heads
    env: dict[str, object] = dict(scalars)
    env.update(
        sm_scale=sm_scale, head_dim=head_dim, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads
    )
    for value in values:
        e = value.expr
        names = _free_names(e) or frozenset()
        call_names = names - HEAD_BUILTINS
        if not call_names <= env.keys() or any(_non_finite(env[n]) for n in call_names):
            continue
        for head in _heads_to_check(names, num_qo_heads, num_kv_heads):
            if head is not None:  # the kernels' GQA grouping: query heads of one KV head adjacent
                env.update(qo_head=head, kv_head=head // max(num_qo_heads // num_kv_heads, 1))
            unit = "request" if head is None else "query head"
            problem = _range_problem(e, env, unit, value.overflow_only)
            if problem is not None:
                inputs = _inputs_text(call_names, env)
                where = "" if head is None else f" (query head {head})"
                return f"{inputs}{where}: {problem}"
    return None


def _heads_to_check(
    names: frozenset[str], num_qo_heads: int, num_kv_heads: int
) -> Sequence[int | None]:
    """The query heads to evaluate a value reading ``names`` at: none (None) when it reads
    no head index, every head when it reads ``qo_head``, else the first of each KV head's."""
    if not names & HEAD_BUILTINS:
        return (None,)
    if "qo_head" in names:
        return range(num_qo_heads)
    return range(0, num_qo_heads, max(num_qo_heads // num_kv_heads, 1))


def _range_problem(
    e: ir.Expr, env: Mapping[str, object], unit: str, overflow_only: bool = False
) -> str | None:
    try:
        device = evaluate(e, env, binary32=True)
        exact = evaluate(e, env)
    except (OverflowError, ZeroDivisionError, ValueError):
        return None
    if exact == 0.0 or math.isnan(exact):
        return None
    if math.isfinite(device) and (device == 0.0 or abs(device) >= F32_MIN_NORMAL or overflow_only):
        return None
    what = "is not finite" if not math.isfinite(device) else "falls below the normal range 2^-126"
    return (
        f"the kernels compute {format_ir(e)} once per {unit} in float32, and it {what} "
        f"({exact:.6g} exactly), where the kernels' float32 math would flush it to 0 or give "
        "inf or NaN; choose values that keep it within float32's normal range"
    )


def _free_names(e: ir.Expr) -> frozenset[str] | None:
    """The built-ins and scalar params ``e`` reads; None when it reads a tensor or a built-in
    that differs between the requests or the rows of a head."""
    names = set()
    for node in ir.walk(e):
        if isinstance(node, ir.TensorLoad):
            return None
        if isinstance(node, ir.Builtin):
            if node.name not in CALL_BUILTINS | HEAD_BUILTINS:
                return None
            names.add(node.name)
        elif isinstance(node, ir.ParamRef):
            names.add(node.name)
    return frozenset(names)


def _non_finite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _inputs_text(names: frozenset[str], env: Mapping[str, object]) -> str:
    return ", ".join(f"{n} = {env[n]!r}" for n in sorted(names))
