"""Emit the CUDA functor struct of a variant (the kernel contract) from optimised IR.

Sub-expressions known per request are computed in the constructor, those known per query
row (and head) in ``row()``; repeated element-level sub-expressions become local constants.
User code only lands in the named slots of ``templates/functor.cuh.j2``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from attnc.codegen.cuda_expr import CTYPES, CudaContext, CudaText, render
from attnc.codegen.element_cost import element_transcendentals
from attnc.codegen.guarded_reads import always_evaluated, guard_walk
from attnc.codegen.key_values import key_reads, key_terms
from attnc.codegen.mask_bounds_cuda import render_mask_bounds
from attnc.codegen.mask_cuda import (
    render_classify,
    render_kv_range,
    render_row_kv_range,
    row_interval_eligible,
)
from attnc.codegen.names import comment_text, variant_struct
from attnc.codegen.params_layout import ParamField, params_layout
from attnc.codegen.score_forms import element_score, score_forms
from attnc.codegen.templates import render_template
from attnc.compiler import ir
from attnc.compiler.bias_step import bias_step
from attnc.compiler.hoist import is_leaf, level
from attnc.compiler.index_range import proven_loads, proven_without_guards
from attnc.compiler.mask_analysis import MaskAnalysis
from attnc.compiler.results import AffineScore, Compiled
from attnc.compiler.token_index import reads_token_tensor
from attnc.dsl.limits import deep_recursion

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


# A node this many levels above the leaves gets a local name, so no generated line nests
# parentheses much deeper than twice this (compilers limit nesting).
NESTING_STEP = 48


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


@dataclass(frozen=True)
class KeyHook:
    """An element hook's ``*_at`` twin, which takes a key's values (``KeyValues``) instead
    of reading them: its C++ return type, the plain hook's name and arguments, its body."""

    ctype: str
    name: str
    args: str
    body: Body
    poly_exp2: bool = False  # a template on bool kPolyExp2 (score_raw_at)


@dataclass(frozen=True)
class HoistedValue:
    """A request member or Row field: its C++ type, name and the body that defines it (the
    body's shared sub-expressions as local constants, then the value)."""

    ctype: str
    name: str
    body: Body


def struct_name(variant: ir.VariantIR) -> str:
    """The C++ name of a variant's functor struct."""
    return variant_struct(variant.name)


def param_fields(variant: ir.VariantIR) -> tuple[ParamField, ...]:
    """Members of the Params struct, in the order of the runtime param list."""
    return params_layout(variant.params)


class _Hoister:
    """Assigns names to request-level (members) and row-level (Row fields) values."""

    def __init__(self, variant: ir.VariantIR) -> None:
        self.request: list[tuple[ir.Expr, str]] = []
        self.row: list[tuple[ir.Expr, str]] = []
        # 1-D per-token / per-request tensors: their reads (kv_idx, q_pos guarded, q_idx,
        # batch) never leave the request's slice, so hoisting one out of a guard is safe.
        self.safe_loads = frozenset(
            p.name for p in variant.params if p.token_dim is not None and len(p.dims) == 1
        )
        self.base = CudaContext(
            builtins=REQUEST_NAMES,
            dims=DIMS,
            tensor_dims={p.name: p.dims for p in variant.params if p.kind == "tensor"},
            bool_params=frozenset(p.name for p in variant.params if p.dtype == ir.BOOL),
            proven_loads=proven_loads(variant),
        )

    def add_element_expr(self, e: ir.Expr) -> None:
        for sub in _safe_hoistable(e, ir.ELEMENT, self.safe_loads):
            if level(sub) == ir.REQUEST:
                self._add_request(sub)
            else:
                for inner in _safe_hoistable(sub, ir.HEAD, self.safe_loads):
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
        return CudaContext(
            names,
            hoisted,
            DIMS,
            self.base.tensor_dims,
            self.base.bool_params,
            self.base.proven_loads,
        )

    def request_values(self) -> list[HoistedValue]:
        """The request members in order, each defined by the members before it."""
        values = []
        for i, (e, name) in enumerate(self.request):
            ctx = CudaContext(
                REQUEST_NAMES,
                dict(self.request[:i]),
                DIMS,
                self.base.tensor_dims,
                self.base.bool_params,
                self.base.proven_loads,
            )
            values.append(HoistedValue(CTYPES[e.type], name, _body(e, ctx, f"{name}_t")))
        return values

    def row_values(self) -> list[HoistedValue]:
        """The Row fields in order, each defined by the request members and the fields
        before it."""
        values = []
        for i, (e, name) in enumerate(self.row):
            ctx = self.context(ROW_ARG_NAMES, None)
            ctx.hoisted.update({x: f"row.{n}" for x, n in self.row[:i]})
            values.append(HoistedValue(CTYPES[e.type], name, _body(e, ctx, f"{name}_t")))
        return values


def _safe_hoistable(
    e: ir.Expr, below: int, safe_loads: frozenset[str] = frozenset()
) -> list[ir.Expr]:
    """Hoistable sub-expressions, leaving guarded ones (under ?: or the right side of
    && / ||) in place when evaluating them early could read out of bounds (a read of a
    tensor in ``safe_loads`` at a built-in index is always in bounds; an i32 ``/`` or ``%``
    is total, see :func:`_reads_tensor`)."""
    found: dict[ir.Expr, None] = {}

    def take(node: ir.Expr, guarded: bool) -> bool:
        risky = _reads_tensor(node) and not _safe_load(node, safe_loads)
        if level(node) < below and not is_leaf(node) and not (guarded and risky):
            found.setdefault(node)
            return False
        return True

    for _ in guard_walk(e, take):
        pass
    return list(found)


def _safe_load(e: ir.Expr, safe_loads: frozenset[str]) -> bool:
    """A read of a batch-flattened tensor at a built-in index (always inside the slice)."""
    return (
        isinstance(e, ir.TensorLoad)
        and e.name in safe_loads
        and all(isinstance(i, ir.Builtin) for i in e.indices)
    )


def _reads_tensor(e: ir.Expr) -> bool:
    """Whether evaluating ``e`` could read a tensor (remembered per node). An i32 ``/`` or
    ``%`` alone is safe to evaluate anywhere in C++: a divisor that may be 0 or -1 goes
    through the total helpers ``attnc::vm::idiv_`` / ``imod_``."""
    return ir.bottom_up(e, "_reads_tensor", _own_reads_tensor)


def _own_reads_tensor(e: ir.Expr) -> bool:
    return isinstance(e, ir.TensorLoad) or any(c.__dict__["_reads_tensor"] for c in ir.children(e))


def _body(e: ir.Expr, ctx: CudaContext, prefix: str = "t") -> Body:
    """The body computing ``e`` with shared sub-expressions (two or more uses) bound to local
    constants ``<prefix>0, <prefix>1, ...`` once, so a DAG is emitted in its size, not its
    unfolded tree's. One that reads no tensor is bound ahead of everything, guards included:
    it runs anyway or is harmless (i32 ``/`` and ``%`` are total in C++, see
    :func:`_reads_tensor`). One that may read a tensor and that ``e`` does not always
    evaluate (it sits under a ?: arm or the right side of && / ||) is bound with its reads
    bounds-checked, since a guard may be what keeps its indices in bounds (see
    :mod:`attnc.codegen.guarded_reads`)."""
    nodes = ir.postorder(e)
    uses: dict[int, int] = {}
    for node in nodes:
        if node in ctx.hoisted:
            continue
        for c in ir.children(node):
            uses[id(c)] = uses.get(id(c), 0) + 1
    named = [n for n in nodes if _needs_name(n, uses, ctx)]
    reads = {id(n) for n in named if _reads_tensor(n)}
    always = always_evaluated(nodes, reads, ctx.hoisted)
    local_ctx = ctx.with_names({})
    text = CudaText(local_ctx)
    checked = CudaText(local_ctx, checked_reads=True)
    locals_: list[Value] = []
    for node in named:
        if node in local_ctx.hoisted:  # an equal node already bound
            continue
        guarded = id(node) in reads and id(node) not in always
        value = (checked if guarded else text).render(node)
        name = f"{prefix}{len(locals_)}"
        locals_.append(Value(CTYPES[node.type], name, value))
        local_ctx.hoisted[node] = name
    return Body(tuple(locals_), text.render(e))


@dataclass(frozen=True)
class KeyField:
    """A member of ``KeyValues``: its C++ type, name, and the body computing it in
    ``key_values`` (a bool as an int, so that every member is 4 bytes)."""

    ctype: str
    name: str
    body: Body


def _key_fields(v: ir.VariantIR, terms: tuple[ir.Expr, ...], ctx: CudaContext) -> list[KeyField]:
    """The members of ``KeyValues``: ``key_values`` computes every key's terms ahead of any
    guard, so a read there is plain only where no guard is needed to keep it inside."""
    loads = [n for t in terms for n in ir.walk(t) if isinstance(n, ir.TensorLoad)]
    unguarded = ctx.with_proven(proven_without_guards(v, loads))
    return [
        KeyField(_key_ctype(t), f"k{i}", _body(t, unguarded, f"k{i}_")) for i, t in enumerate(terms)
    ]


def _key_ctype(term: ir.Expr) -> str:
    return "int" if term.type == ir.BOOL else CTYPES[term.type]


def _key_name(i: int, term: ir.Expr) -> str:
    """How the ``*_at`` hooks spell key term ``i``."""
    return f"(key.k{i} != 0)" if term.type == ir.BOOL else f"key.k{i}"


def _key_hook(
    ctype: str, name: str, args: str, e: ir.Expr | None, plain: str | None, ctx: CudaContext
) -> KeyHook:
    """The ``*_at`` twin of one element hook (score_raw_at a template, as score_raw)."""
    if e is None:
        return KeyHook(ctype, name, args, Body((), str(plain)))
    poly = name == "score_raw"
    return KeyHook(ctype, name, args, _body(e, ctx.with_poly_exp2() if poly else ctx), poly)


def _needs_name(node: ir.Expr, uses: dict[int, int], ctx: CudaContext) -> bool:
    """Shared (or deep: keeps each line's nesting bounded), not a leaf, not hoisted."""
    deep = ir.depth(node) % NESTING_STEP == 0
    return (uses.get(id(node), 0) >= 2 or deep) and not is_leaf(node) and node not in ctx.hoisted


@dataclass(frozen=True)
class FunctorTraits:
    """The functor's compile-time flags the kernel templates choose their shapes by."""

    use_softmax: bool  # kUseSoftmax
    mask_reads_tokens: bool  # kMaskReadsTokens
    bias_step: bool  # kBiasStep
    score_reads_by_key: bool  # kScoreReadsByKey


def _bias_step_expr(compiled: Compiled) -> ir.Expr | None:
    affine = compiled.affine
    return bias_step(affine.bias) if affine is not None and not affine.identity else None


def functor_traits(compiled: Compiled) -> FunctorTraits:
    """The flags ``emit_functor`` writes into the functor of ``compiled``."""
    v = compiled.variant
    return FunctorTraits(
        use_softmax=v.normalize == "softmax",
        mask_reads_tokens=v.mask is not None and reads_token_tensor(v.mask, v.params),
        bias_step=_bias_step_expr(compiled) is not None,
        score_reads_by_key=v.score is not None and reads_by_key(v.score),
    )


def reads_by_key(e: ir.Expr) -> bool:
    """Whether ``e`` reads a tensor at an index built from ``kv_idx``: the kernels then pass
    its functions only keys of the request (a tail tile's keys past its end see its last
    key), so such a read stays where the index checks proved it (``kv_idx < kv_len``)."""
    return any(
        isinstance(n, ir.TensorLoad)
        and any(
            isinstance(b, ir.Builtin) and b.name == "kv_idx" for i in n.indices for b in ir.walk(i)
        )
        for n in ir.walk(e)
    )


def key_value_terms(compiled: Compiled) -> tuple[ir.Expr, ...]:
    """The key terms (:func:`attnc.codegen.key_values.key_terms`) of the forms the kernels
    evaluate per element: the mask, and the affine bias, the log2 form (softmax) or the raw
    form (no softmax) of the score. Non-empty: the functor has ``KeyValues``."""
    with deep_recursion():
        score = element_score(compiled, *score_forms(compiled))
        return key_terms([e for e in (compiled.variant.mask, score) if e is not None])


def emit_functor(compiled: Compiled, source_file: str | None = None, *, header: bool = True) -> str:
    """The C++ text of the functor struct (a self-contained header). Its first comment names
    ``source_file`` (its base name) when given: a module's functor names none, so the same
    text compiles to the same module whichever file it was read from. ``header`` False leaves
    out ``#pragma once`` (the text pasted into a module's .cu file)."""
    with deep_recursion():
        return _emit_functor(compiled, source_file, header)


def unguarded_value_exprs(compiled: Compiled) -> tuple[ir.Expr, ...]:
    """The values the functor computes once per request (its ``c<i>`` members) or once per
    query head (its Row fields) that an element hook uses outside every ?: branch and
    right side of && / || (a value used only under a guard may be out of range where the
    guard is false, and is then not used), in order: requests first."""
    hoister, log2_score, raw_score = _hoisted(compiled)
    unguarded: set[ir.Expr] = set()
    for x in _element_exprs(compiled, log2_score, raw_score):
        unguarded.update(node for node, guarded in guard_walk(x) if not guarded)
    values = [e for e, _ in hoister.request] + [e for e, _ in hoister.row]
    return tuple(e for e in values if e in unguarded)


def _hoisted(compiled: Compiled) -> tuple[_Hoister, ir.Expr | None, ir.Expr | None]:
    """The hoister holding every element hook's values, and the log2 and raw score forms."""
    hoister = _Hoister(compiled.variant)
    log2_score, raw_score = score_forms(compiled)
    for x in _element_exprs(compiled, log2_score, raw_score):
        hoister.add_element_expr(x)
    return hoister, log2_score, raw_score


def _element_exprs(
    compiled: Compiled, log2_score: ir.Expr | None, raw_score: ir.Expr | None
) -> list[ir.Expr]:
    """What the element hooks evaluate: the variant's hooks, the score's log2 and raw
    forms, and an affine score's scale and bias."""
    v = compiled.variant
    exprs = [x for x in (v.score, v.mask, v.output, log2_score, raw_score) if x is not None]
    if compiled.affine is not None:
        exprs += [compiled.affine.scale, compiled.affine.bias]
    return exprs


def _emit_functor(compiled: Compiled, source_file: str | None, header: bool) -> str:
    v = compiled.variant
    affine: AffineScore | None = compiled.affine
    hoister, log2_score, raw_score = _hoisted(compiled)
    ctx = hoister.context(ELEMENT_NAMES, "row.")
    request_ctx = hoister.context(REQUEST_NAMES, None)
    # The tile ranges evaluate the mask's atoms without their guards: a read is plain there
    # only where its index needs no guard (``p >= 0 && p < 4 && kv_idx <= t[p]`` read t[p]
    # at any p). A checked read's 0 is sound: the guard decides those tiles whatever it is.
    ranges_ctx = request_ctx.with_proven(proven_without_guards(v, request_ctx.proven_loads or ()))
    analysis: MaskAnalysis = compiled.mask_analysis
    one, zero = ir.Const(1.0, ir.F32), ir.Const(0.0, ir.F32)
    traits = functor_traits(compiled)
    reads_tokens = traits.mask_reads_tokens
    step = _bias_step_expr(compiled)
    reads = key_reads(v)
    touched = [f"attnc::vm::prefetch_l1_({CudaText(ctx).checked_address(n)})" for n in reads]
    terms = key_value_terms(compiled)
    key_fields = _key_fields(v, terms, ctx)
    key_ctx = ctx.with_names({t: _key_name(i, t) for i, t in enumerate(terms)})
    score_args, key_args = "const Row& row, float s, int kv_idx", "const Row& row, int kv_idx"
    element_hooks = (
        ("float", "score", score_args, v.score, "s"),
        ("float", "score_log2", score_args, log2_score, None),
        ("float", "score_raw", score_args, raw_score, None),
        ("float", "score_bias", key_args, affine.bias if affine else None, "0.0f"),
        ("bool", "mask", key_args, v.mask, "true"),
    )
    key_hooks = [
        _key_hook(ctype, name, args, e, plain, key_ctx)
        for ctype, name, args, e, plain in element_hooks
        if terms and (e is not None or plain is not None)
    ]
    bounds = (
        render_mask_bounds(v.mask, v.params, lambda e: render(e, ranges_ctx))
        if v.mask is not None and reads_tokens
        else ""
    )
    return render_template(
        "functor.cuh.j2",
        name=struct_name(v),
        variant_name=comment_text(v.name),
        source=comment_text(os.path.basename(source_file)) if source_file else None,
        header=header,
        param_fields=param_fields(v),
        request_values=hoister.request_values(),
        row_values=hoister.row_values(),
        use_softmax=traits.use_softmax,
        has_mask=v.mask is not None,
        score_identity=affine is not None and affine.identity,
        score_transcendentals=element_transcendentals(
            element_score(compiled, log2_score, raw_score) or zero,
            {**ctx.hoisted, **{t: "" for t in terms}},  # key terms: once per key
        ),
        affine=affine is not None,
        has_output=v.output is not None,
        score=_body(v.score, ctx) if v.score is not None else Body((), "s"),
        score_log2=_body(log2_score, ctx) if log2_score is not None else None,
        score_raw=_body(raw_score, ctx.with_poly_exp2()) if raw_score is not None else None,
        score_scale=render(affine.scale if affine else one, ctx),
        score_bias=_body(affine.bias if affine else zero, ctx),
        bias_step=step is not None,
        score_bias_step=_body(step if step is not None else zero, ctx),
        mask=_body(v.mask, ctx) if v.mask is not None else Body((), "true"),
        has_sink=v.sink is not None,
        sink=_body(v.sink, ctx) if v.sink is not None else Body((), "-INFINITY"),
        mask_reads_tokens=reads_tokens,
        score_reads_by_key=traits.score_reads_by_key,
        key_reads=touched,
        key_fields=key_fields,
        key_hooks=key_hooks,
        mask_bounds_body=bounds,
        output=_body(v.output, ctx) if v.output is not None else Body((), "o"),
        kv_range_body=render_kv_range(analysis, lambda e: render(e, ranges_ctx)),
        row_kv_range_body=(
            render_row_kv_range(analysis, lambda e: render(e, ranges_ctx))
            if row_interval_eligible(analysis)
            else ""
        ),
        classify_body=render_classify(analysis, lambda e: render(e, ranges_ctx)),
        mask_summary=comment_text(analysis.describe(), limit=2000),
    )
