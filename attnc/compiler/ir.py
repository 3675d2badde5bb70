"""The IR: a small tree of frozen, hashable dataclasses with source locations.

Locations are excluded from equality and hashing, so structurally equal sub-trees compare
equal (which gives CSE and cache keys for free). Every expression carries its type:
``i32``, ``f32`` or ``bool``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from attnc.dsl.errors import NO_LOC, Loc

I32 = "i32"
F32 = "f32"
BOOL = "bool"
TYPES = (I32, F32, BOOL)


def _loc() -> Loc:
    return field(default=NO_LOC, compare=False, repr=False)  # type: ignore[return-value]


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


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Builtin:
    name: str
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class ParamRef:
    """A scalar runtime param."""

    name: str
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class TensorLoad:
    """``name[indices]`` of a tensor param (dense, row-major)."""

    name: str
    indices: tuple[Expr, ...]
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Unary:
    """``op``: ``neg`` or ``not``."""

    op: str
    x: Expr
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Binary:
    """``op``: ``+ - * / % < <= > >= == != && ||``. Operands already share a type
    (casts are explicit); ``/`` and ``%`` on i32 truncate toward zero like C, with
    ``x / 0 == 0`` and ``x % 0 == x``."""

    op: str
    a: Expr
    b: Expr
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Call:
    """A built-in math function (see FUNCTIONS); arguments already share a type."""

    fn: str
    args: tuple[Expr, ...]
    type: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Cast:
    """Conversion to ``type`` (i32 -> f32 exact; f32 -> i32 truncates like C)."""

    x: Expr
    type: str
    loc: Loc = _loc()


Expr = Union[Const, Builtin, ParamRef, TensorLoad, Unary, Binary, Select, Call, Cast]

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
LOGICAL = ("&&", "||")
ARITHMETIC = ("+", "-", "*", "/", "%")


@dataclass(frozen=True)
class ParamDecl:
    """A runtime param. ``kind`` is ``scalar`` or ``tensor``; ``dims`` hold ints or the
    names ``num_qo_heads``/``num_kv_heads``/``head_dim``; ``default`` is a Python value."""

    name: str
    kind: str
    dtype: str
    dims: tuple[int | str, ...] = ()
    default: float | int | bool | None = None
    loc: Loc = _loc()

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class VariantIR:
    """One lowered variant. ``score``/``mask``/``output`` are None when not given
    (identity score, no mask, identity output)."""

    name: str
    doc: str
    params: tuple[ParamDecl, ...]
    score: Expr | None
    mask: Expr | None
    output: Expr | None
    normalize: str = "softmax"
    kv_layouts: tuple[str, ...] = ("paged", "ragged", "dense")
    file: str = ""
    loc: Loc = _loc()

    def param(self, name: str) -> ParamDecl:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


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


def walk(e: Expr):
    """All nodes of ``e``, parents before children."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))
