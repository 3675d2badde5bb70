"""Owns: :class:`ExprText`, the one walk that turns an IR expression into target-language text.

It dispatches on the node kind, spells a sub-expression bound to a name (hoisted or let-bound)
as that name, and renders the children; each back end (C++ for the functor, eager PyTorch for
the reference) says only how each kind and each operator is spelled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attnc.compiler import ir


class ExprText:
    """Text of IR expressions in one target language; subclasses spell each node kind."""

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

    def const(self, e: ir.Const) -> str:
        """A literal."""
        raise NotImplementedError

    def builtin(self, e: ir.Builtin) -> str:
        """A built-in read-only name."""
        raise NotImplementedError

    def param_ref(self, e: ir.ParamRef) -> str:
        """A scalar runtime param."""
        raise NotImplementedError

    def tensor_load(self, e: ir.TensorLoad) -> str:
        """A read of a tensor param."""
        raise NotImplementedError

    def unary(self, e: ir.Unary) -> str:
        """``!x``, wrapping i32 negation, or f32 negation."""
        x = self.render(e.x)
        if e.op == "not":
            return self.logical_not(x)
        if e.type == ir.I32:
            return self.wrapping_neg(x)
        return f"(-{x})"

    def logical_not(self, x: str) -> str:
        """Boolean negation of the text ``x``."""
        raise NotImplementedError

    def wrapping_neg(self, x: str) -> str:
        """i32 negation of the text ``x`` that wraps like two's complement."""
        raise NotImplementedError

    def binary(self, e: ir.Binary) -> str:
        """A binary operator."""
        raise NotImplementedError

    def select(self, e: ir.Select) -> str:
        """``cond ? a : b``."""
        raise NotImplementedError

    def cast(self, e: ir.Cast) -> str:
        """A conversion to ``e.type``."""
        raise NotImplementedError

    def call(self, e: ir.Call) -> str:
        """A built-in math function."""
        raise NotImplementedError

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
