"""Render IR expressions as eager PyTorch (Python source text) for the reference back end.

Every leaf is a tensor taken from ``env`` (built-ins and scalar params, broadcastable over
[heads, queries, keys]) or ``P`` (tensor params); i32 values are int64 tensors holding i32
values and f32 values tensors of the reference's float dtype, which (with the device) is read
from the built-in ``sm_scale`` (no param can shadow a built-in, so user names never collide with
what the generated code reads). User names only appear as quoted dictionary keys. i32 ``+ - *``
and negation wrap like two's complement i32 (``_wrap``); integer ``/`` and ``%`` truncate like
C; ``min``, ``max`` and ``clamp`` compare as the kernels do (``a < b ? a : b``, so a NaN
operand gives what the kernels give). Every discrete decision on f32 values (a comparison,
``int()``, ``floor``, ``ceil``, ``%``) is rendered with its whole operand sub-expressions in
binary32, read from ``e32`` (the environment rounded to float32, see ``_binary32_env``), as
the kernels take it: a float64 reference keeps float64 values everywhere else, and would
decide otherwise on a rounding boundary (``float(kv_idx) + p <= p``). f32 constants are f32
values (``inf`` and ``nan`` included) spelled as Python floats.
"""

from __future__ import annotations

import math

from attnc.codegen.expr_text import ExprText
from attnc.codegen.guarded_reads import guarded_children
from attnc.compiler import ir

CALLS = {
    "tanh": "torch.tanh",
    "exp": "torch.exp",
    "exp2": "torch.exp2",
    "log": "torch.log",
    "log2": "torch.log2",
    "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt",
    "sigmoid": "torch.sigmoid",
    "softplus": "_softplus",
    "abs": "torch.abs",
    "min": "_min",
    "max": "_max",
    "clamp": "_clamp",
    "floor": "torch.floor",
    "ceil": "torch.ceil",
}


def render_float(x: float) -> str:
    """Python text of a float value, ``inf`` and ``nan`` included."""
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "float('-inf')"
    return repr(float(x))


def _const(e: ir.Const, env: str) -> str:
    if e.type == ir.F32:
        return f"_f32({env}, {render_float(float(e.value))})"
    if e.type == ir.I32:
        return f"_i32({env}, {int(e.value)})"
    return f"_bool({env}, {bool(e.value)})"


def decides(e: ir.Expr) -> bool:
    """Whether ``e`` takes a discrete decision on f32 operands (a comparison, ``int()``,
    ``floor``, ``ceil``, ``%``): the reference renders it in binary32."""
    if isinstance(e, ir.Binary):
        return (e.op in ir.COMPARISONS or e.op == "%") and e.a.type == ir.F32
    if isinstance(e, ir.Cast):
        return e.type == ir.I32 and e.x.type == ir.F32
    return isinstance(e, ir.Call) and e.fn in ("floor", "ceil")


def render_torch(
    e: ir.Expr,
    names: dict[ir.Expr, str] | None = None,
    guarded: bool = False,
    proven: frozenset[ir.Expr] = frozenset(),
    *,
    names32: dict[ir.Expr, str] | None = None,
    binary32: bool = False,
) -> str:
    """Python expression text computing ``e`` with torch; sub-expressions in ``names`` are
    spelled as those (local) names, and inside a decision (:func:`decides`) those in
    ``names32`` (locals computed in binary32). ``guarded``: ``e`` is only used where a ``?:``
    or ``&&``/``||`` above it selects it (its tensor reads may be out of range elsewhere).
    ``proven``: the reads whose indices are proven inside their dims
    (``index_range.proven_loads``); every other read gives 0 outside the shape, as the
    kernels' bounds-checked read does. ``binary32``: ``e`` itself is computed in binary32
    (from ``e32``)."""
    text = _TorchText(names or {}, names32 or {}, guarded, proven, binary32)
    return text.render(e)


class _TorchText(ExprText):
    """Renders one expression, with some sub-expressions already bound to local names.

    torch evaluates both branches of ``torch.where`` and both sides of ``&``/``|``, where the
    kernels evaluate one branch of ``?:`` and the right side of ``&&``/``||`` only when it
    decides: tensor reads there are guarded (:func:`guarded_children`) and never raise."""

    not_template = "(~{x})"  # elementwise on a bool tensor
    wrapping_neg_template = "_wrap(-{x})"

    def __init__(
        self,
        names: dict[ir.Expr, str],
        names32: dict[ir.Expr, str],
        guarded: bool,
        proven: frozenset,
        binary32: bool = False,
    ) -> None:
        super().__init__(names32 if binary32 else names)
        self.wide_names, self.names32 = names, names32
        self.guarded = guarded
        self.proven = proven
        self.binary32 = binary32
        self.env = "e32" if binary32 else "env"

    def render(self, e: ir.Expr) -> str:
        """The text of ``e``; a decision outside binary32 is rendered in binary32."""
        if self.binary32 or not decides(e) or e in self.names:
            return super().render(e)
        inner = _TorchText(self.wide_names, self.names32, self.guarded, self.proven, True)
        text = inner.render(e)
        if e.type == ir.F32:  # floor, ceil, %: an exact binary32 value, in the reference's type
            return f"{text}.to(_ftype(env))"
        return text

    def render_guarded(self, e: ir.Expr) -> str:
        """The text of ``e`` where a guard above selects it."""
        outer, self.guarded = self.guarded, True
        try:
            return self.render(e)
        finally:
            self.guarded = outer

    def operands(self, e: ir.Expr) -> list[str]:
        """The texts of ``e``'s children, those under a guard (:func:`guarded_children`)
        rendered guarded."""
        return [self.render_guarded(c) if g else self.render(c) for c, g in guarded_children(e)]

    def const(self, e: ir.Const) -> str:
        """A constant tensor of the reference's type (binary32 inside a decision)."""
        return _const(e, self.env)

    def builtin(self, e: ir.Builtin) -> str:
        """The built-in's tensor in ``env`` (``e32`` inside a decision)."""
        return f"{self.env}[{e.name!r}]"

    def param_ref(self, e: ir.ParamRef) -> str:
        """The scalar param's tensor in ``env`` (``e32`` inside a decision)."""
        return f"{self.env}[{e.name!r}]"

    def tensor_load(self, e: ir.TensorLoad) -> str:
        """A gather from the tensor param ``P[name]``."""
        indices = self.args(e.indices)
        load = "_load_guarded" if self.guarded else "_load"
        if e not in self.proven:
            load = "_load_in_shape"
        first = e.indices[0]
        if isinstance(first, ir.Builtin) and first.name == "q_pos":
            return f"_load_at_pos({load}, P[{e.name!r}], {indices})"  # q_pos < 0 reads 0
        return f"{load}(P[{e.name!r}], {indices})"

    def select(self, e: ir.Select) -> str:
        """``torch.where``, its branches guarded."""
        cond, a, b = self.operands(e)
        return f"torch.where({cond}, {a}, {b})"

    def cast(self, e: ir.Cast) -> str:
        """``.to`` the reference's float type or int64; f32 to i32 through ``_to_i32``
        (saturating, NaN to 0), rendered in binary32 as every decision is."""
        if e.type == ir.I32 and e.x.type == ir.F32:
            return f"_to_i32({self.render(e.x)})"
        target = f"_ftype({self.env})" if e.type == ir.F32 else "torch.int64"
        return f"{self.render(e.x)}.to({target})"

    def call(self, e: ir.Call) -> str:
        """The torch function (i32 ``abs`` wraps like C's)."""
        args = self.args(e.args)
        if e.fn == "abs" and e.type == ir.I32:
            return f"_wrap(torch.abs({args}))"
        return f"{CALLS[e.fn]}({args})"

    def binary(self, e: ir.Binary) -> str:
        """Torch operators; i32 ``+ - * /`` wrap and ``/ %`` truncate like C; the right side
        of ``&&``/``||`` is guarded."""
        a, b = self.operands(e)
        if e.op == "/" and e.type == ir.I32:
            return f"_wrap(_idiv({a}, {b}))"
        if e.op in ("+", "-", "*") and e.type == ir.I32:
            return f"_wrap({a} {e.op} {b})"
        if e.op == "%" and e.type == ir.I32:
            return f"_imod({a}, {b})"
        if e.op == "%":
            return f"_fmod({a}, {b})"
        op = {"&&": "&", "||": "|"}.get(e.op, e.op)
        return f"({a} {op} {b})"
