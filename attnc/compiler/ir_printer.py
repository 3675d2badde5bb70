"""Readable text of the IR (``attnc compile --emit ir|opt``): expressions in source syntax
with explicit casts, plus declarations and analyses."""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.hoist import level
from attnc.dsl.errors import printable
from attnc.dsl.limits import deep_recursion
from attnc.dsl.printer import BINARY_PREC

_PREC = BINARY_PREC  # the source syntax binds as the .attn printer does


# Above this many nodes when unfolded, shared sub-expressions are printed once, by name.
MAX_UNFOLDED = 2000


def format_ir(e: ir.Expr) -> str:
    """Source-like text of an IR expression (casts shown as f32(...) / i32(...)). A DAG
    whose unfolded tree is large is printed as ``let %0 = ..., %1 = ... in expr``."""
    with deep_recursion():
        return _format(e)


def _format(e: ir.Expr) -> str:
    if _unfolded_size(e) <= MAX_UNFOLDED:
        return _fmt(e, 0, {})
    uses: dict[int, int] = {}
    nodes = ir.postorder(e)
    for node in nodes:
        for c in ir.children(node):
            uses[id(c)] = uses.get(id(c), 0) + 1
    names: dict[int, str] = {}
    lets = []
    for node in nodes:
        if uses.get(id(node), 0) > 1 and ir.children(node):
            lets.append(f"%{len(names)} = {_fmt(node, 0, names)}")
            names[id(node)] = f"%{len(names)}"
    body = _fmt(e, 0, names)
    return f"let {', '.join(lets)} in {body}" if lets else body


def _unfolded_size(e: ir.Expr) -> int:
    size: dict[int, int] = {}
    for node in ir.postorder(e):
        total = 1 + sum(size[id(c)] for c in ir.children(node))
        size[id(node)] = min(total, MAX_UNFOLDED + 1)
    return size[id(e)]


def _fmt(e: ir.Expr, min_prec: int, names: dict[int, str]) -> str:
    named = names.get(id(e))
    if named is not None:
        return named
    if isinstance(e, ir.Const):
        if e.type == ir.BOOL:
            return "true" if e.value else "false"
        return repr(float(e.value)) if e.type == ir.F32 else str(int(e.value))
    if isinstance(e, (ir.Builtin, ir.ParamRef)):
        return e.name
    if isinstance(e, ir.TensorLoad):
        return f"{e.name}[{', '.join(_fmt(i, 0, names) for i in e.indices)}]"
    if isinstance(e, ir.Unary):
        return _paren(f"{'!' if e.op == 'not' else '-'}{_fmt(e.x, 8, names)}", 8, min_prec)
    if isinstance(e, ir.Binary):
        p = _PREC[e.op]
        return _paren(f"{_fmt(e.a, p, names)} {e.op} {_fmt(e.b, p + 1, names)}", p, min_prec)
    if isinstance(e, ir.Select):
        text = f"{_fmt(e.cond, 2, names)} ? {_fmt(e.a, 1, names)} : {_fmt(e.b, 1, names)}"
        return _paren(text, 1, min_prec)
    if isinstance(e, ir.Cast):
        return f"{e.type}({_fmt(e.x, 0, names)})"
    if isinstance(e, ir.Call):
        return f"{e.fn}({', '.join(_fmt(a, 0, names) for a in e.args)})"
    raise TypeError(f"not an IR expression: {e!r}")


def _paren(text: str, prec: int, min_prec: int) -> str:
    return f"({text})" if prec < min_prec else text


def format_variant(v: ir.VariantIR) -> str:
    """Declarations and expressions of a variant, one per line (its file name and doc with
    their control characters escaped, so each stays on its line and cannot drive a terminal)."""
    lines = [f"variant {v.name}  # {printable(v.file)}"]
    if v.doc:
        lines.append(f"  doc: {printable(v.doc)}")
    for p in v.params:
        default = "" if p.kind == "tensor" or p.default is None else f" = {p.default}"
        lines.append(f"  param {p.name}: {p.type_text()}{default}")
    lines.append(f"  normalize: {v.normalize}")
    lines.append(f"  kv_layout: {' | '.join(v.kv_layouts)}")
    for name in ("score", "mask", "output"):
        e = getattr(v, name)
        text = (
            "(identity)"
            if e is None and name != "mask"
            else "(none)"
            if e is None
            else (f"{format_ir(e)}  : {e.type} @ {ir.LEVEL_NAMES[level(e)]}")
        )
        lines.append(f"  {name} = {text}")
    if v.sink is not None:
        where = ir.LEVEL_NAMES[level(v.sink)]
        lines.append(f"  sink = {format_ir(v.sink)}  : {v.sink.type} @ {where}")
    return "\n".join(lines) + "\n"
