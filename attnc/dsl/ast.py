"""AST of the `.attn` language (v2): frozen dataclasses, each with its source location.

The parser produces a :class:`Module`; the compiler's lowering pass consumes it. Names and
literals are kept as written; all checking happens in ``attnc.compiler``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from attnc.dsl.errors import Loc
from attnc.dsl.located import Located


# ----------------------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Num(Located):
    """A numeric literal; ``is_float`` is true when written with a '.' or exponent."""

    value: float | int
    is_float: bool


@dataclass(frozen=True)
class BoolLit(Located):
    value: bool


@dataclass(frozen=True)
class Name(Located):
    """A reference to a built-in, param, let, or def argument."""

    id: str


@dataclass(frozen=True)
class Unary(Located):
    """``op`` is one of ``-``, ``!``, ``+``."""

    op: str
    operand: Expr


@dataclass(frozen=True)
class Binary(Located):
    """``op`` is one of ``+ - * / % < <= > >= == != && ||``."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Ternary(Located):
    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(frozen=True)
class Call(Located):
    """A call of a built-in function or a top-level ``def``."""

    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Index(Located):
    """``name[i, j, ...]`` on a tensor param."""

    name: str
    indices: tuple[Expr, ...]


Expr = Union[Num, BoolLit, Name, Unary, Binary, Ternary, Call, Index]


# ----------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class ScalarType(Located):
    """``f32``, ``i32`` or ``bool``."""

    name: str


@dataclass(frozen=True)
class TensorType(Located):
    """``tensor<f32|i32>[dim, ...]``; a dim is a Num or a Name (``num_qo_heads`` ...)."""

    elem: str
    dims: tuple[Expr, ...]


@dataclass(frozen=True)
class Doc(Located):
    text: str


@dataclass(frozen=True)
class Param(Located):
    name: str
    type: ScalarType | TensorType
    default: Expr | None


@dataclass(frozen=True)
class Let(Located):
    name: str
    value: Expr


@dataclass(frozen=True)
class Assign(Located):
    """``target = value;`` for score, mask, output, sink (any other target is a lowering
    error)."""

    target: str
    value: Expr


@dataclass(frozen=True)
class Normalize(Located):
    """``normalize = softmax | none;`` (``mode`` as written; checked in lowering)."""

    mode: str


@dataclass(frozen=True)
class KvLayout(Located):
    """``kv_layout = paged | ragged | dense;`` (names as written; checked in lowering)."""

    layouts: tuple[str, ...]


VariantItem = Union[Doc, Param, Let, Assign, Normalize, KvLayout]


@dataclass(frozen=True)
class Variant(Located):
    name: str
    items: tuple[VariantItem, ...]


@dataclass(frozen=True)
class Def(Located):
    """Top-level helper ``def name(a, b) = expr;``."""

    name: str
    params: tuple[str, ...]
    body: Expr
    param_locs: tuple[Loc, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Import(Located):
    """``import "path.attn";`` (path relative to the importing file)."""

    path: str


TopItem = Union[Import, Def, Variant]


@dataclass(frozen=True)
class Module(Located):
    """One parsed file."""

    file: str
    items: tuple[TopItem, ...]
