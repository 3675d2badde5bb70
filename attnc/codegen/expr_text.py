"""Owns: :class:`ExprText`, the one walk that turns an IR expression into target-language text.

It dispatches on the node kind, spells a sub-expression bound to a name (hoisted or let-bound)
as that name, and renders the children; each back end (C++ for the functor, eager PyTorch for
the reference) says only how each kind and each operator is spelled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from attnc.compiler import ir


class ExprText:
    """Text of IR expressions in one target language.

    A subclass spells each node kind with a method named in :data:`_KIND_METHODS` (``const``,
    ``builtin``, ``param_ref``, ``tensor_load``, ``binary``, ``select``, ``cast``, ``call``,
    each taking the node), and the unary operators with two templates of the operand's text
    ``{x}``; :meth:`unary` is shared.
    """

    not_template: ClassVar[str]
    """Boolean negation of ``{x}``."""
    wrapping_neg_template: ClassVar[str]
    """i32 negation of ``{x}`` that wraps like two's complement."""

    def __init__(self, names: Mapping[ir.Expr, str]) -> None:
        self.names = names

    def render(self, e: ir.Expr) -> str:
        """The text of ``e``; a sub-expression in ``names`` is spelled as its name."""
        found = self.names.get(e)
        if found is not None:
            return found
        kind = _KIND_METHODS.get(type(e))
        if kind is None:
            raise TypeError(f"cannot render {e!r}")
        spell: Callable[[ir.Expr], str] = getattr(self, kind)
        return spell(e)

    def unary(self, e: ir.Unary) -> str:
        """``!x``, wrapping i32 negation, or f32 negation."""
        x = self.render(e.x)
        if e.op == "not":
            return self.not_template.format(x=x)
        if e.type == ir.I32:
            return self.wrapping_neg_template.format(x=x)
        return f"(-{x})"

    def args(self, exprs: tuple[ir.Expr, ...]) -> str:
        """The texts of ``exprs``, comma separated."""
        return ", ".join(self.render(x) for x in exprs)


# The method of ExprText that spells each node kind.
_KIND_METHODS: dict[type, str] = {
    ir.Const: "const",
    ir.Builtin: "builtin",
    ir.ParamRef: "param_ref",
    ir.TensorLoad: "tensor_load",
    ir.Unary: "unary",
    ir.Binary: "binary",
    ir.Select: "select",
    ir.Cast: "cast",
    ir.Call: "call",
}
