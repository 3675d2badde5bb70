"""Render IR expressions as eager PyTorch (Python source text) for the reference back end.

Every leaf is a tensor taken from ``env`` (built-ins and scalar params, broadcastable over
[heads, queries, keys]) or ``P`` (tensor params); i32 values are int64 tensors and f32 values
tensors of the reference's float dtype ``env['_F']``. Integer ``/`` and ``%`` truncate like C.
"""

from __future__ import annotations

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
    "min": "torch.minimum",
    "max": "torch.maximum",
    "clamp": "_clamp",
    "floor": "torch.floor",
    "ceil": "torch.ceil",
}


def render_torch(e: ir.Expr) -> str:
    """Python expression text computing ``e`` with torch."""
    if isinstance(e, ir.Const):
        return f"_const(env, {e.value!r}, {e.type!r})"
    if isinstance(e, (ir.Builtin, ir.ParamRef)):
        return f"env[{e.name!r}]"
    if isinstance(e, ir.TensorLoad):
        indices = ", ".join(render_torch(i) for i in e.indices)
        return f"_load(P[{e.name!r}], {indices})"
    if isinstance(e, ir.Unary):
        op = "~" if e.op == "not" else "-"
        return f"({op}{render_torch(e.x)})"
    if isinstance(e, ir.Binary):
        return _binary(e)
    if isinstance(e, ir.Select):
        return f"torch.where({render_torch(e.cond)}, {render_torch(e.a)}, {render_torch(e.b)})"
    if isinstance(e, ir.Cast):
        target = "env['_F']" if e.type == ir.F32 else "torch.int64"
        return f"{render_torch(e.x)}.to({target})"
    if isinstance(e, ir.Call):
        args = ", ".join(render_torch(a) for a in e.args)
        return f"{CALLS[e.fn]}({args})"
    raise TypeError(f"cannot render {e!r}")


def _binary(e: ir.Binary) -> str:
    a, b = render_torch(e.a), render_torch(e.b)
    if e.op == "/" and e.type == ir.I32:
        return f"_idiv({a}, {b})"
    if e.op == "%" and e.type == ir.I32:
        return f"_imod({a}, {b})"
    if e.op == "%":
        return f"torch.fmod({a}, {b})"
    op = {"&&": "&", "||": "|"}.get(e.op, e.op)
    return f"({a} {op} {b})"
