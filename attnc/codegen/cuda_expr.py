"""Render IR expressions as C++ expressions for the generated functor.

A :class:`CudaContext` says how leaves are spelled where the expression is placed (e.g.
``q_idx`` is an argument inside ``row()`` but ``row.q_idx`` inside ``score()``) and which
sub-expressions were hoisted to named values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from attnc.codegen.expr_text import ExprText
from attnc.codegen.names import param_field
from attnc.compiler import ir
from attnc.compiler.numeric import I32_MIN, shortest_f32_text

CTYPES = {ir.F32: "float", ir.I32: "int", ir.BOOL: "bool"}


def cpp_name(name: str) -> str:
    """The C++ member name of the runtime param ``name`` (mangled, see ``names``)."""
    return param_field(name)


@dataclass
class CudaContext:
    """Spelling of leaves and hoisted values at one place in the functor."""

    builtins: dict[str, str]
    hoisted: dict[ir.Expr, str] = field(default_factory=dict)
    dims: dict[str, str] = field(default_factory=dict)
    tensor_dims: dict[str, tuple[int | str, ...]] = field(default_factory=dict)
    bool_params: frozenset[str] = frozenset()
    # Reads whose indices are proven inside their dims (compiler/index_range.py
    # proven_loads): read plainly; every other read is bounds-checked. None: all checked.
    proven_loads: frozenset[ir.Expr] | None = None
    # Inside a hook templated on ``bool kPolyExp2`` (score_raw): the exp-based functions pass
    # it on (``attnc::vm::exp_<kPolyExp2>``: exp2_poly instead of MUFU.EX2 where true).
    poly_exp2: bool = False

    def with_proven(self, proven: frozenset[ir.Expr]) -> CudaContext:
        """This context with ``proven`` as the reads spelled plainly (every other checked)."""
        return dataclasses.replace(self, hoisted=dict(self.hoisted), proven_loads=proven)

    def with_names(self, names: dict[ir.Expr, str]) -> CudaContext:
        """This context with ``names`` spelling those sub-expressions too."""
        return dataclasses.replace(self, hoisted={**self.hoisted, **names})

    def with_poly_exp2(self) -> CudaContext:
        """This context inside a hook templated on ``bool kPolyExp2`` (score_raw): its
        exp-based calls pass it on, so the Hopper consumers can take part of them from
        exp2_poly."""
        return dataclasses.replace(self, poly_exp2=True)


# The attnc::vm functions whose device exp2 can come from exp2_poly (a template on bool).
POLY_EXP2_FUNCTIONS = frozenset({"exp", "sigmoid", "inv1p_exp2"})


def render(e: ir.Expr, ctx: CudaContext) -> str:
    """C++ text of ``e``."""
    return CudaText(ctx).render(e)


class CudaText(ExprText):
    """C++ spelling of IR expressions at one place of the functor (see :class:`CudaContext`).
    With ``checked_reads`` every tensor read is bounds-checked (``attnc::vm::load_in_shape_``:
    0 outside the declared shape), for an expression evaluated where its source guards may
    not hold (see :mod:`attnc.codegen.guarded_reads`)."""

    not_template = "(!{x})"
    wrapping_neg_template = "int(0u - unsigned({x}))"  # computed in unsigned, cast back

    def __init__(self, ctx: CudaContext, checked_reads: bool = False) -> None:
        super().__init__(ctx.hoisted)
        self.ctx = ctx
        self.checked_reads = checked_reads

    def const(self, e: ir.Const) -> str:
        """A C++ literal."""
        return render_const(e)

    def builtin(self, e: ir.Builtin) -> str:
        """The built-in's spelling at this place."""
        return self.ctx.builtins[e.name]

    def param_ref(self, e: ir.ParamRef) -> str:
        """The param's field of ``p`` (a bool param is stored as a number)."""
        field_ = f"p.{cpp_name(e.name)}"
        return f"({field_} != 0)" if e.name in self.ctx.bool_params else field_

    def tensor_load(self, e: ir.TensorLoad) -> str:
        """An element of the tensor param's array (bounds-checked where its indices are not
        proven inside their dims, or where its guards may not hold)."""
        proven = self.ctx.proven_loads
        if self.checked_reads or proven is None or e not in proven:
            return self._checked_load(e)
        load = f"p.{cpp_name(e.name)}[{self._flat_index(e)}]"
        first = e.indices[0]
        if isinstance(first, ir.Builtin) and first.name == "q_pos":
            # q_pos < 0 (a row of a request with q_len > kv_len) is before the tensor (or the
            # request's slice of a kv_len tensor): such a read gives 0.
            zero = "0.0f" if e.type == ir.F32 else "0"
            return f"({self.render(first)} >= 0 ? {load} : {zero})"
        return load

    def binary(self, e: ir.Binary) -> str:
        """C++ operators; i32 division by a possible 0 or -1 goes through the guarded
        helpers, i32 ``+ - *`` wrap, and f32 ``%`` is C's ``fmodf`` (as the reference's
        ``torch.fmod``; C++ has no ``%`` of floats). ``&&``/``||`` whose right side reads a
        per-token or per-request tensor evaluate both sides (``&``/``|``): such reads stay
        inside the request by the index rule, and the kernels then issue the loads of a tile's
        elements together instead of one branch and one load latency per element."""
        a = self.render(e.a)
        b = self.render(e.b)
        if e.op in ir.LOGICAL and _reads_request_tensors_only(e.b, self.ctx.tensor_dims):
            return f"bool({a} {e.op[0]} {b})"
        if e.type == ir.I32 and e.op in ("/", "%") and not _plain_divisor(e.b):
            fn = "idiv_" if e.op == "/" else "imod_"
            return f"attnc::vm::{fn}({a}, {b})"
        if e.type == ir.I32 and e.op in ("+", "-", "*"):
            # i32 arithmetic wraps (two's complement): computed in unsigned, cast back.
            return f"int(unsigned({a}) {e.op} unsigned({b}))"
        if e.op == "%" and e.type == ir.F32:
            return f"fmodf({a}, {b})"
        return f"({a} {e.op} {b})"

    def select(self, e: ir.Select) -> str:
        """The conditional operator."""
        return f"({self.render(e.cond)} ? {self.render(e.a)} : {self.render(e.b)})"

    def cast(self, e: ir.Cast) -> str:
        """A ``static_cast``; f32 to i32 through ``to_i32_`` (saturating, NaN to 0)."""
        if e.type == ir.I32 and e.x.type == ir.F32:
            return f"attnc::vm::to_i32_({self.render(e.x)})"
        return f"static_cast<{CTYPES[e.type]}>({self.render(e.x)})"

    def call(self, e: ir.Call) -> str:
        """The function's ``attnc::vm`` helper."""
        poly = "<kPolyExp2>" if self.ctx.poly_exp2 and e.fn in POLY_EXP2_FUNCTIONS else ""
        return f"attnc::vm::{e.fn}_{poly}({self.args(e.args)})"

    def _checked_load(self, e: ir.TensorLoad) -> str:
        """The read through ``load_in_shape_``: each index with the size it must stay below
        (a batch-flattened tensor's first index with its request's count; the request index
        ``batch`` is always below the batch size)."""
        return f"attnc::vm::load_in_shape_({self._shape_arguments(e)})"

    def checked_address(self, e: ir.TensorLoad) -> str:
        """The address ``e`` reads, bounds-checked as ``load_in_shape_`` checks its indices
        (``address_in_shape_``: the tensor's first element outside the shape); its index
        expressions read other tensors through checked reads."""
        checked = CudaText(self.ctx, checked_reads=True)
        return f"attnc::vm::address_in_shape_({checked._shape_arguments(e)})"

    def _shape_arguments(self, e: ir.TensorLoad) -> str:
        dims = self.ctx.tensor_dims[e.name]
        parts = [f"p.{cpp_name(e.name)}", TOKEN_STARTS.get(str(dims[0]), "0")]
        for index, dim in zip(e.indices, dims, strict=True):
            parts += [self.render(index), self._dim_size(dim)]
        return ", ".join(parts)

    def _dim_size(self, dim: int | str) -> str:
        if isinstance(dim, int):
            return str(dim)
        return TOKEN_COUNTS.get(dim) or self.ctx.dims[dim]

    def _flat_index(self, e: ir.TensorLoad) -> str:
        dims = self.ctx.tensor_dims[e.name]
        text = self.render(e.indices[0])
        start = TOKEN_STARTS.get(str(dims[0]))
        if start is not None:  # flattened over the batch: the request's slice starts at start
            text = f"{start} + {text}" if len(dims) == 1 else f"({start} + {text})"
        for index, dim in zip(e.indices[1:], dims[1:], strict=True):
            text = f"({text} * {self._dim_size(dim)} + {self.render(index)})"
        return text


def _reads_request_tensors_only(e: ir.Expr, dims: dict[str, tuple[int | str, ...]]) -> bool:
    """Whether ``e`` reads at least one tensor and only 1-D per-token or per-request ones
    (``kv_len``, ``q_len``, ``batch_size``), whose reads are in bounds whatever the other
    operand of a logical operator says."""
    loads = [n for n in ir.walk(e) if isinstance(n, ir.TensorLoad)]
    return bool(loads) and all(
        len(dims[n.name]) == 1 and str(dims[n.name][0]) in ir.TOKEN_DIMS for n in loads
    )


def _plain_divisor(b: ir.Expr) -> bool:
    """A constant divisor other than 0 and -1 needs no guard (C's / and % are then exact)."""
    return isinstance(b, ir.Const) and int(b.value) not in (0, -1)


def render_const(e: ir.Const) -> str:
    """A literal of the constant's type (floats always with an ``f`` suffix)."""
    if e.type == ir.BOOL:
        return "true" if e.value else "false"
    if e.type == ir.I32:
        value = int(e.value)
        if value == I32_MIN:
            return "(-2147483647 - 1)"  # 2147483648 alone is not an int literal
        return f"({value})" if value < 0 else str(value)
    x = float(e.value)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    text = shortest_f32_text(x)  # the IR holds binary32 values; this text rounds back to x
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if math.copysign(1.0, x) < 0 else f"{text}f"  # -0.0 too: no '--'


# Where a batch-flattened tensor's slice of the current request starts (RequestInfo fields).
TOKEN_STARTS = {"kv_len": "r.kv_start", "q_len": "r.q_start"}
# The entries of such a tensor's first dim that belong to the current request (the request
# index ``batch`` needs no check: it is always below the batch size).
TOKEN_COUNTS = {"kv_len": "r.kv_len", "q_len": "r.q_len", "batch_size": "2147483647"}
