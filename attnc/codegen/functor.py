"""Emit the CUDA functor struct of a variant (the kernel contract) from optimised IR.

Sub-expressions known per request are computed in the constructor, those known per query
row (and head) in ``row()``; repeated element-level sub-expressions become local constants.
User code only lands in the named slots of ``templates/functor.cuh.j2``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from attnc.codegen.cuda_expr import CTYPES, CudaContext, cpp_name, render
from attnc.codegen.mask_cuda import render_classify, render_kv_range
from attnc.codegen.templates import render_template
from attnc.compiler import ir
from attnc.compiler.hoist import is_leaf, level
from attnc.compiler.mask_analysis import MaskAnalysis
from attnc.compiler.results import AffineScore, Compiled

REQUEST_NAMES = {
    "sm_scale": "r.sm_scale",
    "q_len": "r.q_len",
    "kv_len": "r.kv_len",
    "batch": "r.batch",
    "head_dim": "r.head_dim",
    "num_qo_heads": "r.num_qo_heads",
    "num_kv_heads": "r.num_kv_heads",
}
ROW_ARG_NAMES = {
    **REQUEST_NAMES,
    "q_idx": "q_idx",
    "q_pos": "row.q_pos",
    "qo_head": "qo_head",
    "kv_head": "row.kv_head",
}
ELEMENT_NAMES = {
    **REQUEST_NAMES,
    "q_idx": "row.q_idx",
    "q_pos": "row.q_pos",
    "qo_head": "row.qo_head",
    "kv_head": "row.kv_head",
    "kv_idx": "kv_idx",
    "score": "s",
    "out": "o",
}
DIMS = {
    "num_qo_heads": "r.num_qo_heads",
    "num_kv_heads": "r.num_kv_heads",
    "head_dim": "r.head_dim",
}


@dataclass(frozen=True)
class Field:
    """A C++ struct member: type, name and (for params) a comment."""

    ctype: str
    name: str
    comment: str = ""


@dataclass(frozen=True)
class Value:
    """A hoisted value: its member name, C++ type and defining expression."""

    ctype: str
    name: str
    expr: str


@dataclass(frozen=True)
class Body:
    """A function body: local constants then the returned expression."""

    locals: tuple[Value, ...]
    result: str


def struct_name(variant: ir.VariantIR) -> str:
    """The C++ name of a variant's functor struct."""
    return f"Variant_{variant.name}"


def param_fields(variant: ir.VariantIR) -> list[Field]:
    """Members of the Params struct, in the order of the runtime param list."""
    fields = []
    for p in variant.params:
        if p.kind == "tensor":
            ctype = "const float*" if p.dtype == ir.F32 else "const int*"
            dims = ", ".join(str(d) for d in p.dims)
            comment = f"tensor<{p.dtype}>[{dims}], dense row-major"
        else:
            ctype = "int" if p.dtype == ir.BOOL else CTYPES[p.dtype]
            comment = p.dtype + (" (0 or 1)" if p.dtype == ir.BOOL else "")
        fields.append(Field(ctype, cpp_name(p.name), comment))
    return fields


class _Hoister:
    """Assigns names to request-level (members) and row-level (Row fields) values."""

    def __init__(self, variant: ir.VariantIR) -> None:
        self.request: list[tuple[ir.Expr, str]] = []
        self.row: list[tuple[ir.Expr, str]] = []
        self.base = CudaContext(
            builtins=REQUEST_NAMES,
            dims=DIMS,
            tensor_dims={p.name: p.dims for p in variant.params if p.kind == "tensor"},
            bool_params=frozenset(p.name for p in variant.params if p.dtype == ir.BOOL),
        )

    def add_element_expr(self, e: ir.Expr) -> None:
        for sub in _safe_hoistable(e, ir.ELEMENT):
            if level(sub) == ir.REQUEST:
                self._add_request(sub)
            else:
                for inner in _safe_hoistable(sub, ir.HEAD):
                    self._add_request(inner)
                if all(sub != known for known, _ in self.row):
                    self.row.append((sub, f"h{len(self.row)}"))

    def _add_request(self, e: ir.Expr) -> None:
        if all(e != known for known, _ in self.request):
            self.request.append((e, f"c{len(self.request)}"))

    def context(self, names: dict[str, str], row_prefix: str | None) -> CudaContext:
        hoisted = {e: n for e, n in self.request}
        if row_prefix is not None:
            hoisted.update({e: f"{row_prefix}{n}" for e, n in self.row})
        return CudaContext(names, hoisted, DIMS, self.base.tensor_dims, self.base.bool_params)

    def request_values(self) -> list[Value]:
        values = []
        for i, (e, name) in enumerate(self.request):
            ctx = CudaContext(
                REQUEST_NAMES,
                dict(self.request[:i]),
                DIMS,
                self.base.tensor_dims,
                self.base.bool_params,
            )
            values.append(Value(CTYPES[e.type], name, render(e, ctx)))
        return values

    def row_values(self) -> list[Value]:
        values = []
        for i, (e, name) in enumerate(self.row):
            ctx = self.context(ROW_ARG_NAMES, None)
            ctx.hoisted.update({x: f"row.{n}" for x, n in self.row[:i]})
            values.append(Value(CTYPES[e.type], name, render(e, ctx)))
        return values


def _safe_hoistable(e: ir.Expr, below: int) -> list[ir.Expr]:
    """Hoistable sub-expressions, leaving guarded ones (under ?: or the right side of
    && / ||) in place when evaluating them early could read out of bounds or divide by 0."""
    found: list[ir.Expr] = []

    def visit(node: ir.Expr, guarded: bool) -> None:
        if level(node) < below and not is_leaf(node) and not (guarded and _risky(node)):
            if node not in found:
                found.append(node)
            return
        if isinstance(node, ir.Select):
            visit(node.cond, guarded)
            visit(node.a, True)
            visit(node.b, True)
        elif isinstance(node, ir.Binary) and node.op in ir.LOGICAL:
            visit(node.a, guarded)
            visit(node.b, True)
        else:
            for c in ir.children(node):
                visit(c, guarded)

    visit(e, False)
    return found


def _risky(e: ir.Expr) -> bool:
    return any(
        isinstance(n, ir.TensorLoad)
        or (isinstance(n, ir.Binary) and n.op in ("/", "%") and n.type == ir.I32)
        for n in ir.walk(e)
    )


def _body(e: ir.Expr, ctx: CudaContext) -> Body:
    """Element-level body with repeated sub-expressions bound to local constants once."""
    counts: dict[ir.Expr, int] = {}
    for node in ir.walk(e):
        if not is_leaf(node) and node not in ctx.hoisted:
            counts[node] = counts.get(node, 0) + 1
    repeated = [n for n in _postorder(e) if counts.get(n, 0) > 1 and not _risky(n)]
    local_ctx = CudaContext(
        ctx.builtins, dict(ctx.hoisted), ctx.dims, ctx.tensor_dims, ctx.bool_params
    )
    locals_: list[Value] = []
    for i, node in enumerate(dict.fromkeys(repeated)):
        text = render(node, local_ctx)
        name = f"t{i}"
        locals_.append(Value(CTYPES[node.type], name, text))
        local_ctx.hoisted[node] = name
    return Body(tuple(locals_), render(e, local_ctx))


def _postorder(e: ir.Expr) -> list[ir.Expr]:
    out: list[ir.Expr] = []
    for c in ir.children(e):
        out.extend(_postorder(c))
    out.append(e)
    return out


def emit_functor(compiled: Compiled) -> str:
    """The C++ text of the functor struct (a self-contained header)."""
    v = compiled.variant
    affine: AffineScore | None = compiled.affine
    hoister = _Hoister(v)
    element_exprs = [x for x in (v.score, v.mask, v.output) if x is not None]
    if affine is not None:
        element_exprs += [affine.scale, affine.bias]
    for x in element_exprs:
        hoister.add_element_expr(x)
    ctx = hoister.context(ELEMENT_NAMES, "row.")
    request_ctx = hoister.context(REQUEST_NAMES, None)
    analysis: MaskAnalysis = compiled.mask_analysis
    one, zero = ir.Const(1.0, ir.F32), ir.Const(0.0, ir.F32)
    return render_template(
        "functor.cuh.j2",
        name=struct_name(v),
        variant=v,
        source=os.path.basename(v.file) if v.file else "<string>",
        param_fields=param_fields(v),
        request_values=hoister.request_values(),
        row_values=hoister.row_values(),
        use_softmax=v.normalize == "softmax",
        has_mask=v.mask is not None,
        score_identity=affine is not None and affine.identity,
        affine=affine is not None,
        has_output=v.output is not None,
        score=_body(v.score, ctx) if v.score is not None else Body((), "s"),
        score_scale=render(affine.scale if affine else one, ctx),
        score_bias=_body(affine.bias if affine else zero, ctx),
        mask=_body(v.mask, ctx) if v.mask is not None else Body((), "true"),
        output=_body(v.output, ctx) if v.output is not None else Body((), "o"),
        kv_range_body=render_kv_range(analysis, lambda e: render(e, request_ctx)),
        classify_body=render_classify(analysis, lambda e: render(e, request_ctx)),
        mask_summary=analysis.describe(),
    )
