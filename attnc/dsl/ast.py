"""AST of the `.attn` language (v2): frozen dataclasses (:class:`Located`), each with its
source location.

The parser produces a :class:`Module`; the compiler's lowering pass consumes it. Names and
literals are kept as written; all checking happens in ``attnc.compiler``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Union

from attnc.dsl.errors import Loc
from attnc.dsl.located import Located


# ----------------------------------------------------------------------------- expressions
class Num(Located):
    """A numeric literal; ``is_float`` is true when written with a '.' or exponent."""

    value: float | int
    is_float: bool


class BoolLit(Located):
    """``true`` or ``false``."""

    value: bool


class Name(Located):
    """A reference to a built-in, param, let, or def argument."""

    id: str


class Unary(Located):
    """``op`` is one of ``-``, ``!``, ``+``."""

    op: str
    operand: Expr


class Binary(Located):
    """``op`` is one of ``+ - * / % < <= > >= == != && ||``."""

    op: str
    left: Expr
    right: Expr


class Ternary(Located):
    """``cond ? then : otherwise``."""

    cond: Expr
    then: Expr
    otherwise: Expr


class Call(Located):
    """A call of a built-in function or a top-level ``def``."""

    func: str
    args: tuple[Expr, ...]


class Index(Located):
    """``name[i, j, ...]`` on a tensor param."""

    name: str
    indices: tuple[Expr, ...]


Expr = Union[Num, BoolLit, Name, Unary, Binary, Ternary, Call, Index]


# ----------------------------------------------------------------------------- declarations
class ScalarType(Located):
    """``f32``, ``i32`` or ``bool``."""

    name: str


class TensorType(Located):
    """``tensor<f32|i32>[dim, ...]``; a dim is a Num or a Name (``num_qo_heads`` ...)."""

    elem: str
    dims: tuple[Expr, ...]


class Doc(Located):
    """``doc "...";``: the variant's one-line description (``text`` unescaped)."""

    text: str


class Param(Located):
    """``param name: type [= default];``."""

    name: str
    type: ScalarType | TensorType
    default: Expr | None


class Let(Located):
    """``let name = value;``: a named expression, shared wherever the name is used."""

    name: str
    value: Expr


class Assign(Located):
    """``target = value;`` for score, mask, output, sink (any other target is a lowering
    error)."""

    target: str
    value: Expr


class Normalize(Located):
    """``normalize = softmax | none;`` (``mode`` as written; checked in lowering)."""

    mode: str


class KvLayout(Located):
    """``kv_layout = paged | ragged | dense;`` (names as written; checked in lowering)."""

    layouts: tuple[str, ...]


VariantItem = Union[Doc, Param, Let, Assign, Normalize, KvLayout]


class Variant(Located):
    """``variant name { items }``."""

    name: str
    items: tuple[VariantItem, ...]


class Def(Located):
    """Top-level helper ``def name(a, b) = expr;``."""

    name: str
    params: tuple[str, ...]
    body: Expr
    param_locs: tuple[Loc, ...] = field(default=(), compare=False, repr=False)


class Import(Located):
    """``import "path.attn";`` (path relative to the importing file)."""

    path: str


TopItem = Union[Import, Def, Variant]


class Module(Located):
    """One parsed file."""

    file: str
    items: tuple[TopItem, ...]
