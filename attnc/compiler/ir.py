"""The IR: a DAG of frozen, hashable dataclasses with source locations.

Locations are excluded from equality and hashing, so structurally equal sub-trees compare
equal (which gives CSE and cache keys for free). Every expression carries its type:
``i32``, ``f32`` or ``bool``. Sub-expressions are shared, not copied (a ``let`` or a ``def``
used twice yields one node with two parents), so every pass works per distinct node: each
node caches its hash, equality checks identity and hashes first, and :func:`walk` visits a
node once however many parents it has.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar, Union

from attnc.dsl.limits import deep_recursion
from attnc.dsl.located import Located

I32 = "i32"
F32 = "f32"
BOOL = "bool"
TYPES = (I32, F32, BOOL)
NodeT = TypeVar("NodeT")


def _shared(cls):
    """Give an IR node class a cached hash and an equality that tries identity and the hashes
    first, so hashing or comparing a DAG costs its distinct nodes, not its unfolded tree.
    A hash once taken needs no module global again: a weak memo's removal at interpreter
    exit, when this module's globals may already be None, hashes its key. Cached values
    (``_hash`` and the passes' ``_``-prefixed entries) are not pickled."""
    structural_hash = cls.__hash__
    structural_eq = cls.__eq__

    def __hash__(self) -> int:
        found = self.__dict__.get("_hash")
        if found is None:
            found = structural_hash(self)
            object.__setattr__(self, "_hash", found)
        return found

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__ or hash(self) != hash(other):
            return False
        mine, theirs = _representative(self), _representative(other)
        if mine is theirs:
            return True
        if not structural_eq(self, other):
            return False
        # Equal: remember it, so comparing two separately built copies of a DAG visits each
        # pair of shared nodes once (union-find over representatives), not every path.
        object.__setattr__(theirs, "_same_as", mine)
        return True

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    cls.__hash__ = __hash__
    cls.__eq__ = __eq__
    cls.__getstate__ = __getstate__
    return cls


class ExprNode(Located):
    """Base of the expression nodes: each subclass is a frozen dataclass (see
    :class:`Located`) with the cached hash and shortcut equality of :func:`_shared`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _shared(cls)


def _representative(node: object) -> object:
    """The node that stands for every node found equal to ``node`` so far (path-halving)."""
    while True:
        parent = node.__dict__.get("_same_as")
        if parent is None:
            return node
        grand = parent.__dict__.get("_same_as")
        if grand is not None:
            object.__setattr__(node, "_same_as", grand)
        node = parent


def bottom_up(e, key: str, own):
    """A per-node property remembered on every node under ``key``: ``own(node)`` may read its
    children's values as ``child.__dict__[key]``. Iterative, and nodes that already know the
    property are not visited again, so the cost is the number of new nodes."""
    found = e.__dict__.get(key, _MISSING)
    if found is not _MISSING:
        return found
    stack = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if key in node.__dict__:
            continue
        if expanded:
            object.__setattr__(node, key, own(node))
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if key not in c.__dict__)
    return e.__dict__[key]


_MISSING = object()


# Built-in read-only names, their types, and the hoisting level at which they are known.
# Levels: 0 = request, 1 = head, 2 = query row (row and head), 3 = element (kv position).
REQUEST, HEAD, ROW, ELEMENT = 0, 1, 2, 3
LEVEL_NAMES = ("request", "head", "row", "element")

BUILTINS: dict[str, tuple[str, int]] = {
    "score": (F32, ELEMENT),
    "kv_idx": (I32, ELEMENT),
    "q_idx": (I32, ROW),
    "q_pos": (I32, ROW),
    "qo_head": (I32, HEAD),
    "kv_head": (I32, HEAD),
    "sm_scale": (F32, REQUEST),
    "q_len": (I32, REQUEST),
    "kv_len": (I32, REQUEST),
    "batch": (I32, REQUEST),
    "head_dim": (I32, REQUEST),
    "num_qo_heads": (I32, REQUEST),
    "num_kv_heads": (I32, REQUEST),
}
# `out` is readable only in `output = ...` (the finished output element).
OUTPUT_BUILTIN = "out"

# The keyword-only options of the runtime calls that take params as keyword arguments
# (``Variant.reference`` and ``prefill``, the wrappers' ``run()``, the reference of one
# request of a batch): a param of one of these names could never be passed, so lowering
# refuses it. Their tensor arguments (q, k, v, kv, kv_cache) are positional-only, so a param
# may take those names. Each option maps to the calls that take it; a unit test checks this
# against the calls' signatures.
_EVERY_CALL = (
    "Variant.reference",
    "Variant.prefill",
    "BatchPrefillWrapper.run",
    "BatchDecodeWrapper.run",
    "request_reference",
)
CALL_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "sm_scale": ("Variant.reference", "Variant.prefill", "request_reference"),
        "return_lse": _EVERY_CALL,
        "backend": ("Variant.prefill",),
        "out": ("BatchPrefillWrapper.run", "BatchDecodeWrapper.run"),
        "batch": ("request_reference",),
    }
)

# Tensor dims that grow with the batch (language v2): a tensor whose first dim is one of these
# holds one value per KV token, per query token or per request, flattened over the requests
# of a batch in request order. Its first index must be one of the listed built-ins (the
# checker can then prove the read stays inside the request's slice).
TOKEN_DIMS: dict[str, tuple[str, ...]] = {
    "kv_len": ("kv_idx", "q_pos"),
    "q_len": ("q_idx",),
    "batch_size": ("batch",),
}

# Built-in functions: name -> (arity, result rule). "float" -> f32, "same" -> promoted type.
FUNCTIONS: dict[str, tuple[int, str]] = {
    "tanh": (1, "float"),
    "exp": (1, "float"),
    "exp2": (1, "float"),
    "log": (1, "float"),
    "log2": (1, "float"),
    "sqrt": (1, "float"),
    "rsqrt": (1, "float"),
    "sigmoid": (1, "float"),
    "softplus": (1, "float"),
    "abs": (1, "same"),
    "min": (2, "same"),
    "max": (2, "same"),
    "clamp": (3, "same"),
    "floor": (1, "float"),
    "ceil": (1, "float"),
    "float": (1, "to_f32"),
    "int": (1, "to_i32"),
}


def const_key(value: float | int | bool, type: str) -> tuple[str, object]:
    """What identifies a constant ``value`` of ``type`` in equality and hashing: an f32 by
    the bits of its value (so ``-0.0`` and ``0.0`` differ, as ``1.0 / x`` and ``min`` tell
    them apart, and an unrounded double differs from its binary32 neighbour), except that
    every NaN is one value (every emitter writes them alike, and a NaN's sign and payload do
    not survive the JSON form of the IR); an i32 by its int; a bool by its truth."""
    if type == F32:
        x = float(value)
        return (type, "nan") if math.isnan(x) else (type, struct.pack("<d", x))
    if type == BOOL:
        return (type, bool(value))
    return (type, int(value))


class Const(ExprNode):
    """A literal or folded constant of ``type`` (f32, i32 or bool). Constants are equal when
    their :func:`const_key` is: Python's ``-0.0 == 0.0`` would make IR that differs only in
    a zero's sign equal, and the memos keyed by IR would hand one variant the other's code."""

    value: float | int | bool
    type: str

    def __eq__(self, other: object) -> bool:
        """Same class and same :func:`const_key`."""
        if not isinstance(other, Const):
            return NotImplemented
        return const_key(self.value, self.type) == const_key(other.value, other.type)

    def __hash__(self) -> int:
        """The hash of the :func:`const_key`."""
        return hash(const_key(self.value, self.type))


class Builtin(ExprNode):
    """A value the kernel provides (see BUILTINS): ``score``, ``q_idx``, ``kv_idx`` ..."""

    name: str
    type: str


class ParamRef(ExprNode):
    """A scalar runtime param."""

    name: str
    type: str


class TensorLoad(ExprNode):
    """``name[indices]`` of a tensor param (dense, row-major)."""

    name: str
    indices: tuple[Expr, ...]
    type: str


class Unary(ExprNode):
    """``op``: ``neg`` or ``not``."""

    op: str
    x: Expr
    type: str


class Binary(ExprNode):
    """``op``: ``+ - * / % < <= > >= == != && ||``. Operands already share a type
    (casts are explicit); ``/`` and ``%`` on i32 truncate toward zero like C, with
    ``x / 0 == 0`` and ``x % 0 == x``."""

    op: str
    a: Expr
    b: Expr
    type: str


class Select(ExprNode):
    """``cond ? a : b`` (``a`` and ``b`` share ``type``)."""

    cond: Expr
    a: Expr
    b: Expr
    type: str


class Call(ExprNode):
    """A built-in math function (see FUNCTIONS); arguments already share a type."""

    fn: str
    args: tuple[Expr, ...]
    type: str


class Cast(ExprNode):
    """Conversion to ``type`` (i32 -> f32 exact; f32 -> i32 truncates like C)."""

    x: Expr
    type: str


Expr = Union[Const, Builtin, ParamRef, TensorLoad, Unary, Binary, Select, Call, Cast]

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
LOGICAL = ("&&", "||")


@_shared
class ParamDecl(Located):
    """A runtime param. ``kind`` is ``scalar`` or ``tensor``; ``dims`` hold ints or the
    names ``num_qo_heads``/``num_kv_heads``/``head_dim``, and as the first dim only one of
    :data:`TOKEN_DIMS` (``kv_len``, ``q_len``, ``batch_size``); ``default`` is a Python value."""

    name: str
    kind: str
    dtype: str
    dims: tuple[int | str, ...] = ()
    default: float | int | bool | None = None

    def __eq__(self, other: object) -> bool:
        """Field by field, the default by its :func:`const_key` (``= -0.0`` is not ``= 0.0``)."""
        if not isinstance(other, ParamDecl):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        """The hash of the compared fields, the default by its :func:`const_key`."""
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        names = (f.name for f in dataclasses.fields(self) if f.compare)
        return tuple(self._default_key() if n == "default" else getattr(self, n) for n in names)

    def _default_key(self) -> tuple[str, object] | None:
        return None if self.default is None else const_key(self.default, self.dtype)

    @property
    def required(self) -> bool:
        """Whether every call must give the param (it has no default)."""
        return self.default is None

    def type_text(self) -> str:
        """The declared type as written in ``.attn`` text: ``i32``, ``f32``, ``bool``, or
        ``tensor<f32>[num_qo_heads]`` (no default)."""
        if self.kind == "tensor":
            return f"tensor<{self.dtype}>[{', '.join(str(d) for d in self.dims)}]"
        return self.dtype

    @property
    def token_dim(self) -> str | None:
        """``kv_len``, ``q_len`` or ``batch_size`` when the tensor is flattened over the
        batch (its first dim), else None."""
        if self.kind == "tensor" and self.dims and self.dims[0] in TOKEN_DIMS:
            return str(self.dims[0])
        return None


@_shared
class VariantIR(Located):
    """One lowered variant. ``score``/``mask``/``output``/``sink`` are None when not given
    (identity score, no mask, identity output, no sink). ``sink`` is a row-level f32 logit
    added to every row's softmax denominator (language v2)."""

    name: str
    doc: str
    params: tuple[ParamDecl, ...]
    score: Expr | None
    mask: Expr | None
    output: Expr | None
    normalize: str = "softmax"
    kv_layouts: tuple[str, ...] = ("paged", "ragged", "dense")
    file: str = ""
    sink: Expr | None = None

    def same_code(self, other: VariantIR) -> bool:
        """True when ``other`` differs from this variant at most in what reaches no generated
        code (its doc, source file, KV layouts and param defaults): the two share every
        module. Two separately built copies compare node by node, one level of recursion a
        level of their deepest expression: with the passes' recursion room."""
        with deep_recursion():
            return self._code_part() == other._code_part()

    def _code_part(self) -> VariantIR:
        params = tuple(dataclasses.replace(p, default=None) for p in self.params)
        return dataclasses.replace(self, doc="", file="", kv_layouts=(), params=params)

    def param(self, name: str) -> ParamDecl:
        """The declaration of param ``name`` (KeyError when the variant has none)."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def slots(self) -> tuple[tuple[str, Expr | None], ...]:
        """``(slot name, expression)`` of every expression slot, in a fixed order."""
        return (
            ("score", self.score),
            ("mask", self.mask),
            ("output", self.output),
            ("sink", self.sink),
        )


def children(e: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions of ``e``."""
    if isinstance(e, TensorLoad):
        return e.indices
    if isinstance(e, Unary):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Cast):
        return (e.x,)
    return ()


def walk(e: Expr, below: Callable[[Expr], bool] | None = None):
    """Every distinct node of ``e`` once (a shared sub-expression is visited at its first
    occurrence), parents before children, left to right; with ``below``, the children of a
    node only where ``below(node)`` is true."""
    stack = [e]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if below is None or below(node):
            stack.extend(reversed(children(node)))


def postorder(e: Expr) -> list[Expr]:
    """Every distinct node of ``e`` once, children before parents (iterative)."""
    return postorder_of((e,), children)


def postorder_of(
    roots: Sequence[NodeT], children_of: Callable[[NodeT], Sequence[NodeT]]
) -> list[NodeT]:
    """Every distinct object reachable from ``roots`` (by identity) once, children before
    parents, left to right; iterative, so deep graphs need no recursion."""
    out: list[NodeT] = []
    seen: set[int] = set()
    stack: list[tuple[NodeT, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children_of(node)) if id(c) not in seen)
    return out


def depth(e: Expr) -> int:
    """Longest chain of nodes from ``e`` down to a leaf (1 for a leaf), remembered per node."""
    return bottom_up(e, "_depth", _own_depth)


def _own_depth(e: Expr) -> int:
    return 1 + max((c.__dict__["_depth"] for c in children(e)), default=0)
