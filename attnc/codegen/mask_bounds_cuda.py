"""C++ body of the generated functor's ``mask_bounds`` (the interval form of a mask that reads
per-token tensors; the value types and operations are in ``attnc/mask_bounds.cuh``).

``mask_bounds(q_idx0, q_idx1, kv0, kv1, heads, lanes)`` evaluates the mask once over the box
of queries ``[q_idx0, q_idx1)``, keys ``[kv0, kv1)`` and query heads ``[0, heads)``: every i32
sub-expression as a ``Span`` (an interval holding its value on every pair of the box, or
any value), every bool as a ``Tri`` (may it be true, may it be false), and returns EMPTY,
FULL or PARTIAL (the tile-map classifier then scans the pairs). Leaves: the built-ins'
ranges over the box, request-level values as points (rendered as the functor computes
them), a 1-D per-token i32 tensor read at ``kv_idx``, ``q_pos`` or ``q_idx`` as the min and max
of the tensor over that index range. What the bounds do not follow (f32 values, i32
division, other tensor reads, a request-level value that reads a tensor other than a
per-request one) is unknown, so the answer is always conservative.
"""

from __future__ import annotations

from collections.abc import Callable

from attnc.codegen.cuda_expr import TOKEN_STARTS, cpp_name
from attnc.compiler import ir
from attnc.compiler.hoist import level

RenderExpr = Callable[[ir.Expr], str]

# Built-in ranges over the box (inclusive, as long long).
_RANGES = {
    "kv_idx": ("kv0", "kv1 - 1LL"),
    "q_idx": ("q_idx0", "q_idx1 - 1LL"),
    "q_pos": (
        "static_cast<long long>(q_idx0) + r.kv_len - r.q_len",
        "static_cast<long long>(q_idx1) - 1 + r.kv_len - r.q_len",
    ),
    "qo_head": ("0LL", "heads - 1LL"),
    "kv_head": ("0LL", "(heads - 1LL) / (r.num_qo_heads / r.num_kv_heads)"),
}
_SPAN_OPS = {"+": "span_add", "-": "span_sub", "*": "span_mul"}
_COMPARE_OPS = {
    "<": "span_lt",
    "<=": "span_le",
    ">": "span_gt",
    ">=": "span_ge",
    "==": "span_eq",
    "!=": "span_ne",
}
_SPAN_ANY = "attnc::Span::any()"
_TRI_UNKNOWN = "attnc::Tri::unknown()"


class _BoundsText:
    """One local per node, in post-order: ``Span`` for i32 nodes, ``Tri`` for bool nodes,
    nothing for f32 nodes (their users are unknown)."""

    def __init__(self, params: tuple[ir.ParamDecl, ...], render_request: RenderExpr) -> None:
        self.decls = {p.name: p for p in params}
        self.render_request = render_request
        self.names: dict[ir.Expr, str] = {}
        self.lines: list[str] = []

    def name_of(self, e: ir.Expr) -> str | None:
        """The local holding ``e``'s bounds (None for f32 nodes)."""
        if e not in self.names:
            text = self._bounds(e)
            if text is None:
                return None
            name = f"b{len(self.lines)}"
            ctype = "attnc::Tri" if e.type == ir.BOOL else "attnc::Span"
            self.lines.append(f"const {ctype} {name} = {text};")
            self.names[e] = name
        return self.names[e]

    def _bounds(self, e: ir.Expr) -> str | None:
        if e.type == ir.F32:
            return None
        if level(e) == ir.REQUEST:
            return self._point(e)
        if isinstance(e, ir.Builtin):
            lo, hi = _RANGES[e.name]
            return f"attnc::Span::checked({lo}, {hi})"
        if isinstance(e, ir.TensorLoad):
            return self._token_span(e)
        if isinstance(e, ir.Unary):
            x = self.name_of(e.x)
            if e.op == "not":
                return f"attnc::tri_not({x})" if x else _TRI_UNKNOWN
            return f"attnc::span_neg({x})" if x else _SPAN_ANY
        if isinstance(e, ir.Binary):
            return self._binary(e)
        if isinstance(e, ir.Select):
            return self._select(e)
        if isinstance(e, ir.Call) and e.fn in ("min", "max") and e.type == ir.I32:
            a, b = (self.name_of(x) for x in e.args)
            return f"attnc::span_{e.fn}({a}, {b})"
        return _TRI_UNKNOWN if e.type == ir.BOOL else _SPAN_ANY

    def _point(self, e: ir.Expr) -> str:
        """A request-level value, as the functor computes it (unknown when computing it here
        could read a tensor out of its bounds: the mask may guard that read)."""
        unknown = _TRI_UNKNOWN if e.type == ir.BOOL else _SPAN_ANY
        for node in ir.walk(e):
            if isinstance(node, ir.TensorLoad) and not self._request_row_load(node):
                return unknown
        value = self.render_request(e)
        return f"attnc::Tri::of({value})" if e.type == ir.BOOL else f"attnc::Span::point({value})"

    def _request_row_load(self, e: ir.TensorLoad) -> bool:
        decl = self.decls[e.name]
        return decl.token_dim == "batch_size" and len(decl.dims) == 1

    def _token_span(self, e: ir.TensorLoad) -> str:
        decl = self.decls[e.name]
        index = e.indices[0]
        if (
            decl.dtype != ir.I32
            or len(decl.dims) != 1
            or decl.token_dim not in TOKEN_STARTS
            or not isinstance(index, ir.Builtin)
            or index.name not in ("kv_idx", "q_pos", "q_idx")
        ):
            return _SPAN_ANY
        lo, hi = _RANGES[index.name]
        start = TOKEN_STARTS[str(decl.token_dim)]
        read = f"[&](int i) {{ return p.{cpp_name(e.name)}[{start} + i]; }}"
        return f"attnc::token_span(lanes, {lo}, {hi}, 0, {read})"

    def _binary(self, e: ir.Binary) -> str:
        a, b = self.name_of(e.a), self.name_of(e.b)
        if e.op in ir.LOGICAL:
            fn = "tri_and" if e.op == "&&" else "tri_or"
            return f"attnc::{fn}({a or _TRI_UNKNOWN}, {b or _TRI_UNKNOWN})"
        if e.op in _COMPARE_OPS:
            if a is None or b is None or e.a.type != ir.I32:
                return _TRI_UNKNOWN
            return f"attnc::{_COMPARE_OPS[e.op]}({a}, {b})"
        if e.op in _SPAN_OPS and e.type == ir.I32:
            return f"attnc::{_SPAN_OPS[e.op]}({a}, {b})"
        return _TRI_UNKNOWN if e.type == ir.BOOL else _SPAN_ANY

    def _select(self, e: ir.Select) -> str:
        c = self.name_of(e.cond) or _TRI_UNKNOWN
        a, b = self.name_of(e.a), self.name_of(e.b)
        fn = "tri_select" if e.type == ir.BOOL else "span_select"
        return f"attnc::{fn}({c}, {a}, {b})"


def render_mask_bounds(
    mask: ir.Expr, params: tuple[ir.ParamDecl, ...], render_request: RenderExpr
) -> str:
    """Body of ``template <class Lanes> TileClass mask_bounds(int q_idx0, int q_idx1, int kv0,
    int kv1, int heads, const Lanes& lanes) const``."""
    text = _BoundsText(params, render_request)
    result = text.name_of(mask) or _TRI_UNKNOWN
    return "\n".join([*text.lines, f"return attnc::tri_class({result});"])
