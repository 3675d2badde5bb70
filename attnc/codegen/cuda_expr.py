"""Render IR expressions as C++ expressions for the generated functor.

A :class:`CudaContext` says how leaves are spelled where the expression is placed (e.g.
``q_idx`` is an argument inside ``row()`` but ``row.q_idx`` inside ``score()``) and which
sub-expressions were hoisted to named values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attnc.compiler import ir

CPP_KEYWORDS = frozenset(
    """alignas alignof and asm auto bool break case catch char class const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit
    export extern false float for friend goto if inline int long mutable namespace new
    noexcept not nullptr operator or private protected public register reinterpret_cast
    return short signed sizeof static static_assert static_cast struct switch template this
    throw true try typedef typeid typename union unsigned using virtual void volatile while
    xor p r row s o kv_idx q_idx qo_head""".split()
)

CTYPES = {ir.F32: "float", ir.I32: "int", ir.BOOL: "bool"}


def cpp_name(name: str) -> str:
    """A C++ identifier for a user name (params, variants): keywords get a trailing '_'."""
    return f"{name}_" if name in CPP_KEYWORDS or name.startswith("__") else name


@dataclass
class CudaContext:
    """Spelling of leaves and hoisted values at one place in the functor."""

    builtins: dict[str, str]
    hoisted: dict[ir.Expr, str] = field(default_factory=dict)
    dims: dict[str, str] = field(default_factory=dict)
    tensor_dims: dict[str, tuple[int | str, ...]] = field(default_factory=dict)
    bool_params: frozenset[str] = frozenset()


def render(e: ir.Expr, ctx: CudaContext) -> str:
    """C++ text of ``e``."""
    name = ctx.hoisted.get(e)
    if name is not None:
        return name
    if isinstance(e, ir.Const):
        return render_const(e)
    if isinstance(e, ir.Builtin):
        return ctx.builtins[e.name]
    if isinstance(e, ir.ParamRef):
        field_ = f"p.{cpp_name(e.name)}"
        return f"({field_} != 0)" if e.name in ctx.bool_params else field_
    if isinstance(e, ir.TensorLoad):
        return f"p.{cpp_name(e.name)}[{_flat_index(e, ctx)}]"
    if isinstance(e, ir.Unary):
        op = "!" if e.op == "not" else "-"
        return f"({op}{render(e.x, ctx)})"
    if isinstance(e, ir.Binary):
        if e.type == ir.I32 and e.op in ("/", "%") and not _plain_divisor(e.b):
            fn = "idiv_" if e.op == "/" else "imod_"
            return f"attnc::vm::{fn}({render(e.a, ctx)}, {render(e.b, ctx)})"
        return f"({render(e.a, ctx)} {e.op} {render(e.b, ctx)})"
    if isinstance(e, ir.Select):
        return f"({render(e.cond, ctx)} ? {render(e.a, ctx)} : {render(e.b, ctx)})"
    if isinstance(e, ir.Cast):
        return f"static_cast<{CTYPES[e.type]}>({render(e.x, ctx)})"
    if isinstance(e, ir.Call):
        args = ", ".join(render(a, ctx) for a in e.args)
        return f"attnc::vm::{e.fn}_({args})"
    raise TypeError(f"cannot render {e!r}")


def _plain_divisor(b: ir.Expr) -> bool:
    """A constant divisor other than 0 and -1 needs no guard (C's / and % are then exact)."""
    return isinstance(b, ir.Const) and int(b.value) not in (0, -1)


def render_const(e: ir.Const) -> str:
    """A literal of the constant's type (floats always with an ``f`` suffix)."""
    if e.type == ir.BOOL:
        return "true" if e.value else "false"
    if e.type == ir.I32:
        value = int(e.value)
        return f"({value})" if value < 0 else str(value)
    x = float(e.value)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    text = repr(x)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if x < 0 else f"{text}f"


def _flat_index(e: ir.TensorLoad, ctx: CudaContext) -> str:
    dims = ctx.tensor_dims[e.name]
    text = render(e.indices[0], ctx)
    for index, dim in zip(e.indices[1:], dims[1:], strict=True):
        size = str(dim) if isinstance(dim, int) else ctx.dims[dim]
        text = f"({text} * {size} + {render(index, ctx)})"
    return text
