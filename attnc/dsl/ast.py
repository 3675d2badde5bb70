"""AST of the `.attn` language (v2): frozen dataclasses, each with its source location.

The parser produces a :class:`Module`; the compiler's lowering pass consumes it. Names and
literals are kept as written; all checking happens in ``attnc.compiler``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from attnc.dsl.errors import NO_LOC, Loc


def _loc() -> Loc:
    return field(default=NO_LOC, compare=False, repr=False)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Num:
    """A numeric literal; ``is_float`` is true when written with a '.' or exponent."""

    value: float | int
    is_float: bool
    loc: Loc = _loc()


@dataclass(frozen=True)
class BoolLit:
    value: bool
    loc: Loc = _loc()


@dataclass(frozen=True)
class Name:
    """A reference to a built-in, param, let, or def argument."""

    id: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Unary:
    """``op`` is one of ``-``, ``!``, ``+``."""

    op: str
    operand: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Binary:
    """``op`` is one of ``+ - * / % < <= > >= == != && ||``."""

    op: str
    left: Expr
    right: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Ternary:
    cond: Expr
    then: Expr
    otherwise: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Call:
    """A call of a built-in function or a top-level ``def``."""

    func: str
    args: tuple[Expr, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class Index:
    """``name[i, j, ...]`` on a tensor param."""

    name: str
    indices: tuple[Expr, ...]
    loc: Loc = _loc()


Expr = Union[Num, BoolLit, Name, Unary, Binary, Ternary, Call, Index]


# ----------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class ScalarType:
    """``f32``, ``i32`` or ``bool``."""

    name: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class TensorType:
    """``tensor<f32|i32>[dim, ...]``; a dim is a Num or a Name (``num_qo_heads`` ...)."""

    elem: str
    dims: tuple[Expr, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class Doc:
    text: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Param:
    name: str
    type: ScalarType | TensorType
    default: Expr | None
    loc: Loc = _loc()


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Assign:
    """``target = value;`` for score, mask, output, sink (any other target is a lowering
    error)."""

    target: str
    value: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Normalize:
    """``normalize = softmax | none;`` (``mode`` as written; checked in lowering)."""

    mode: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class KvLayout:
    """``kv_layout = paged | ragged | dense;`` (names as written; checked in lowering)."""

    layouts: tuple[str, ...]
    loc: Loc = _loc()


VariantItem = Union[Doc, Param, Let, Assign, Normalize, KvLayout]


@dataclass(frozen=True)
class Variant:
    name: str
    items: tuple[VariantItem, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class Def:
    """Top-level helper ``def name(a, b) = expr;``."""

    name: str
    params: tuple[str, ...]
    body: Expr
    loc: Loc = _loc()
    param_locs: tuple[Loc, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Import:
    """``import "path.attn";`` (path relative to the importing file)."""

    path: str
    loc: Loc = _loc()


TopItem = Union[Import, Def, Variant]


@dataclass(frozen=True)
class Module:
    """One parsed file."""

    file: str
    items: tuple[TopItem, ...]
    loc: Loc = _loc()
