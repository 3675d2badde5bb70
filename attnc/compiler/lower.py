"""Lower parsed modules to :class:`~attnc.compiler.ir.VariantIR`.

Checks declarations (duplicates, legal assignment targets, param types and defaults,
normalize/kv_layout values, mask/score/output types) and warns about unused params.
Expressions are lowered by :mod:`attnc.compiler.lower_expr`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from attnc.compiler import ir
from attnc.compiler.index_range import check_indices
from attnc.compiler.lower_expr import SUBSTITUTED, Scope, cast, lower_expr, suggest
from attnc.compiler.numeric import round_f32
from attnc.dsl import ast
from attnc.dsl.errors import AttnError, Diagnostic, Loc, note, printable, warning
from attnc.dsl.limits import MAX_IR_DEPTH, MAX_PARAMS, too_deep_message

ASSIGNABLE = ("score", "mask", "output", "sink")
NORMALIZE_MODES = ("softmax", "none")
KV_LAYOUTS = ("paged", "ragged", "dense")
TENSOR_DIM_NAMES = ("num_qo_heads", "num_kv_heads", "head_dim")
ALL_DIM_NAMES = TENSOR_DIM_NAMES + tuple(ir.TOKEN_DIMS)
TopItemT = TypeVar("TopItemT", ast.Variant, ast.Def)


@dataclass(frozen=True)
class Program:
    """Every variant of a file (imports included) and the warnings found while lowering."""

    variants: tuple[ir.VariantIR, ...]
    warnings: tuple[Diagnostic, ...]

    def variant(self, name: str | None = None) -> ir.VariantIR:
        """The variant called ``name``; without a name, the only variant of the root file."""
        if name is None:
            if len(self.variants) != 1:
                listed = ", ".join(v.name for v in self.variants) or "none"
                raise LookupError(f"the file defines several variants ({listed}): choose one")
            return self.variants[0]
        for v in self.variants:
            if v.name == name:
                return v
        names = [v.name for v in self.variants]
        raise LookupError(
            f"no variant '{printable(name)}'{suggest(name, names)}; variants: {', '.join(names)}"
        )


def lower_modules(modules: list[ast.Module]) -> Program:
    """Lower ``modules`` (dependencies first, the root last). Only the root's variants are
    lowered; an imported file's variants keep their names taken (a duplicate is an error)."""
    defs = _collect_defs(modules)
    seen: dict[str, Loc] = {}
    variants: list[ir.VariantIR] = []
    warnings: list[Diagnostic] = []
    root = modules[-1]
    for module, item in _top_items(modules, ast.Variant):
        if item.name in seen:
            raise _duplicate(item, "variant", seen[item.name])
        seen[item.name] = item.loc
        if module is root:
            variant, found = _lower_variant(item, defs, module.file)
            variants.append(variant)
            warnings.extend(found)
    return Program(tuple(variants), tuple(warnings))


def _collect_defs(modules: list[ast.Module]) -> dict[str, ast.Def]:
    defs: dict[str, ast.Def] = {}
    for _, item in _top_items(modules, ast.Def):
        if item.name in defs:
            raise _duplicate(item, "def", defs[item.name].loc)
        if item.name in ir.FUNCTIONS or item.name in ir.BUILTINS:
            raise AttnError(item.loc, f"def '{item.name}' shadows a built-in")
        if len(set(item.params)) != len(item.params):
            raise AttnError(item.loc, f"def '{item.name}' repeats an argument name")
        defs[item.name] = item
    return defs


def _top_items(
    modules: list[ast.Module], kind: type[TopItemT]
) -> list[tuple[ast.Module, TopItemT]]:
    """``(module, item)`` for every top-level item of type ``kind``, in file order."""
    return [(m, item) for m in modules for item in m.items if isinstance(item, kind)]


def _duplicate(item: ast.Variant | ast.Def, what: str, first: Loc) -> AttnError:
    """The error for a second top-level ``what`` named like one defined at ``first``."""
    return AttnError(item.loc, f"duplicate {what} '{item.name}' (first defined at {first})")


class _VariantLowering:
    """State while lowering one variant's items in order."""

    def __init__(self, node: ast.Variant, defs: dict[str, ast.Def], file: str) -> None:
        self.node = node
        self.file = file
        self.scope = Scope(defs=defs)
        self.params: list[ir.ParamDecl] = []
        self.declared: dict[str, Loc] = {}
        self.doc: str | None = None
        self.score: ir.Expr | None = None
        self.mask: ir.Expr | None = None
        self.output: ir.Expr | None = None
        self.sink: ir.Expr | None = None
        self.normalize: str | None = None
        self.layouts: tuple[str, ...] | None = None
        self.assigned: dict[str, Loc] = {}

    def run(self) -> tuple[ir.VariantIR, list[Diagnostic]]:
        for item in self.node.items:
            self._item(item)
        variant = ir.VariantIR(
            name=self.node.name,
            doc=self.doc or "",
            params=tuple(self.params),
            score=self.score,
            mask=self.mask,
            output=self.output,
            normalize=self.normalize or "softmax",
            kv_layouts=self.layouts or KV_LAYOUTS,
            file=self.file,
            sink=self.sink,
            loc=self.node.loc,
        )
        if self.sink is not None and variant.normalize == "none":
            raise AttnError(
                self.assigned["sink"],
                "a sink is an extra logit of the softmax: it needs normalize = softmax "
                f"(normalize = none is given at {self.assigned['normalize']})",
            )
        unused = [
            warning(p.loc, f"param '{p.name}' is never used")
            for p in self.params
            if p.name not in self.scope.used_params
        ]
        return variant, unused + check_indices(variant)

    def _item(self, item: ast.VariantItem) -> None:
        if isinstance(item, ast.Assign):
            self._assign(item)
            for value in (self.score, self.mask, self.output, self.sink):
                if value is not None:
                    _within_depth(value, item.loc)
            return
        if isinstance(item, ast.Doc):
            self._once("doc", item.loc)
            self.doc = item.text
        elif isinstance(item, ast.Param):
            self._param(item)
        elif isinstance(item, ast.Let):
            self._declare(item.name, item.loc, "let")
            self.scope.values[item.name] = _within_depth(
                lower_expr(item.value, self.scope), item.loc
            )
        elif isinstance(item, ast.Assign):
            self._assign(item)
        elif isinstance(item, ast.Normalize):
            self._once("normalize", item.loc)
            if item.mode not in NORMALIZE_MODES:
                raise AttnError(
                    item.loc,
                    f"normalize must be softmax or none, got '{item.mode}'"
                    f"{suggest(item.mode, list(NORMALIZE_MODES))}",
                )
            self.normalize = item.mode
        elif isinstance(item, ast.KvLayout):
            self._once("kv_layout", item.loc)
            self.layouts = _check_layouts(item)

    def _once(self, what: str, loc: Loc) -> None:
        if what in self.assigned:
            raise AttnError(loc, f"{what} is given twice (first at {self.assigned[what]})")
        self.assigned[what] = loc

    def _declare(self, name: str, loc: Loc, kind: str) -> None:
        if name in ir.BUILTINS or name == ir.OUTPUT_BUILTIN:
            raise AttnError(loc, f"{kind} '{name}' shadows the built-in '{name}'")
        if name in self.declared:
            raise AttnError(
                loc, f"duplicate {kind} '{name}' (first declared at {self.declared[name]})"
            )
        self.declared[name] = loc

    def _param(self, item: ast.Param) -> None:
        self._declare(item.name, item.loc, "param")
        if item.name in ir.CALL_OPTIONS:
            calls = ir.CALL_OPTIONS[item.name]
            owners = ", ".join(calls[:-1]) + " and " + calls[-1] if len(calls) > 1 else calls[0]
            raise AttnError(
                item.loc,
                f"param '{item.name}' has the name of a keyword argument of {owners}, so it "
                "could not be passed there: choose another name",
            )
        if len(self.params) == MAX_PARAMS:
            raise AttnError(
                item.loc, f"too many params (more than {MAX_PARAMS}, the limit of one variant)"
            )
        decl = _param_decl(item)
        self.params.append(decl)
        if decl.kind == "tensor":
            self.scope.tensors[item.name] = decl
        else:
            self.scope.values[item.name] = ir.ParamRef(item.name, decl.dtype, loc=item.loc)

    def _assign(self, item: ast.Assign) -> None:
        target = item.target
        if target not in ASSIGNABLE:
            if target in ir.BUILTINS:
                raise AttnError(
                    item.loc,
                    f"cannot assign to built-in '{target}': only score, mask, output and "
                    "sink can be assigned",
                )
            raise AttnError(
                item.loc,
                f"unknown assignment target '{target}'{suggest(target, list(ASSIGNABLE))}; "
                "use 'let' for a local name",
            )
        if target == "score":
            self._assign_score(item)
        elif target == "sink":
            self._assign_sink(item)
        elif target == "mask":
            self._once("mask", item.loc)
            value = lower_expr(item.value, self.scope)
            if value.type != ir.BOOL:
                raise AttnError(item.value.loc, f"mask must be bool, got {value.type}")
            _forbid(value, ("score",), "mask", item.value.loc)
            self.mask = value
        else:
            self._once("output", item.loc)
            self.scope.allow_out = True
            try:
                value = lower_expr(item.value, self.scope)
            finally:
                self.scope.allow_out = False
            _forbid(value, ("score", "kv_idx"), "output", item.value.loc)
            self.output = self._numeric(value, item.value.loc, "output")

    def _assign_score(self, item: ast.Assign) -> None:
        value = self._numeric(lower_expr(item.value, self.scope), item.value.loc, "score")
        # Later uses of `score` (in lets or further assignments) see the new value.
        self.scope.values["score"] = value
        self.score = value

    def _assign_sink(self, item: ast.Assign) -> None:
        self._once("sink", item.loc)
        # `score` in a sink is always the forbidden built-in, even after `score = ...`.
        assigned_score = self.scope.values.pop("score", None)
        try:
            value = lower_expr(item.value, self.scope)
        finally:
            if assigned_score is not None:
                self.scope.values["score"] = assigned_score
        _forbid(value, ("score", "kv_idx"), "sink (one value per query row)", item.value.loc)
        self.sink = self._numeric(value, item.value.loc, "sink")

    @staticmethod
    def _numeric(value: ir.Expr, loc: Loc, what: str) -> ir.Expr:
        if value.type == ir.BOOL:
            raise AttnError(loc, f"{what} must be a number (f32), got bool")
        return cast(value, ir.F32)


def _within_depth(value: ir.Expr, loc: Loc) -> ir.Expr:
    """``value``, unless lets and defs made it deeper than the limit (an error at ``loc``)."""
    if ir.depth(value) > MAX_IR_DEPTH:
        raise AttnError(loc, too_deep_message(SUBSTITUTED, MAX_IR_DEPTH))
    return value


def _forbid(value: ir.Expr, names: tuple[str, ...], what: str, loc: Loc) -> None:
    """Reject built-ins a slot cannot see (the mask is decided before the score exists; the
    output is per query row, after the sum over keys)."""
    for node in ir.walk(value):
        if isinstance(node, ir.Builtin) and node.name in names:
            if not node.loc.line or _within(node.loc, loc):
                raise AttnError(
                    node.loc if node.loc.line else loc, f"{what} cannot use '{node.name}'"
                )
            # The built-in came in through a let or a def: point at it, and at the slot.
            slot = what.split(" ", 1)[0]
            raise AttnError(
                node.loc,
                f"{what} cannot use '{node.name}' (reached through a let or def)",
                (note(loc, f"the {slot} that uses it"),),
            )


def _within(inner: Loc, outer: Loc) -> bool:
    """Whether ``inner`` lies inside the span of ``outer`` (same file)."""
    if inner.file != outer.file or not outer.end_line:
        return inner.file == outer.file and (inner.line, inner.col) == (outer.line, outer.col)
    start, end = (outer.line, outer.col), (outer.end_line, outer.end_col)
    return start <= (inner.line, inner.col) < end


def _lower_variant(
    node: ast.Variant, defs: dict[str, ast.Def], file: str
) -> tuple[ir.VariantIR, list[Diagnostic]]:
    return _VariantLowering(node, defs, file).run()


def _check_layouts(item: ast.KvLayout) -> tuple[str, ...]:
    seen: list[str] = []
    for name in item.layouts:
        if name not in KV_LAYOUTS:
            raise AttnError(
                item.loc,
                f"unknown kv_layout '{name}'{suggest(name, list(KV_LAYOUTS))}; "
                "expected paged, ragged or dense",
            )
        if name in seen:
            raise AttnError(item.loc, f"kv_layout '{name}' is listed twice")
        seen.append(name)
    return tuple(seen)


def _param_decl(item: ast.Param) -> ir.ParamDecl:
    if isinstance(item.type, ast.TensorType):
        if item.default is not None:
            raise AttnError(item.default.loc, f"tensor param '{item.name}' cannot have a default")
        if item.type.elem not in (ir.F32, ir.I32):
            raise AttnError(
                item.type.loc, f"tensor elements must be f32 or i32, got '{item.type.elem}'"
            )
        dims = tuple(_tensor_dim(d) for d in item.type.dims)
        _check_token_dims(item.type.dims, dims)
        return ir.ParamDecl(item.name, "tensor", item.type.elem, dims, None, loc=item.loc)
    dtype = item.type.name
    if dtype not in ir.TYPES:
        raise AttnError(
            item.type.loc, f"unknown type '{dtype}'; expected f32, i32, bool or tensor<...>"
        )
    default = None if item.default is None else _default_value(item.default, dtype)
    return ir.ParamDecl(item.name, "scalar", dtype, (), default, loc=item.loc)


def _tensor_dim(d: ast.Expr) -> int | str:
    if isinstance(d, ast.Num) and not d.is_float:
        if int(d.value) <= 0:
            raise AttnError(d.loc, "tensor dimension must be positive")
        return int(d.value)
    if isinstance(d, ast.Name):
        if d.id not in ALL_DIM_NAMES:
            raise AttnError(
                d.loc,
                f"tensor dimension must be an integer or one of {', '.join(ALL_DIM_NAMES)}, "
                f"got '{d.id}'{suggest(d.id, list(ALL_DIM_NAMES))}",
            )
        return d.id
    raise AttnError(d.loc, "tensor dimension must be an integer literal or a head-count name")


def _check_token_dims(written: tuple[ast.Expr, ...], dims: tuple[int | str, ...]) -> None:
    """A batch-flattened dim (kv_len, q_len, batch_size) may only be the first dim."""
    for i, (node, dim) in enumerate(zip(written, dims, strict=True)):
        if i > 0 and dim in ir.TOKEN_DIMS:
            raise AttnError(
                node.loc,
                f"'{dim}' can only be the first dimension of a tensor (the tensor is "
                "flattened over the requests of a batch along it)",
            )


def _default_value(e: ast.Expr, dtype: str) -> float | int | bool:
    sign = 1
    node = e
    # One sign over a literal; the least i32 is already one negative literal, and a sign
    # over it two (--2147483648 is refused as --5 is).
    if (
        isinstance(node, ast.Unary)
        and node.op in ("-", "+")
        and isinstance(node.operand, ast.Num)
        and node.operand.value >= 0
    ):
        sign = -1 if node.op == "-" else 1
        node = node.operand
    if isinstance(node, ast.BoolLit):
        if dtype != ir.BOOL:
            raise AttnError(e.loc, f"default of a {dtype} param must be a number, got bool")
        return bool(node.value)
    if not isinstance(node, ast.Num):
        raise AttnError(e.loc, "a param default must be a literal (a number, true or false)")
    if dtype == ir.BOOL:
        raise AttnError(e.loc, "default of a bool param must be true or false")
    if dtype == ir.I32:
        if node.is_float:
            raise AttnError(e.loc, "default of an i32 param must be an integer")
        value = sign * int(node.value)
        if not -(2**31) <= value < 2**31:
            raise AttnError(e.loc, f"default {value} does not fit in i32")
        return value
    return round_f32(sign * float(node.value))  # what the kernels get, as literals are rounded
