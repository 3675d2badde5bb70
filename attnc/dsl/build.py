"""Lark parse tree -> AST, giving every node the span it was written at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lark import Token, Tree

from attnc.dsl import ast
from attnc.dsl.errors import AttnError, Loc
from attnc.dsl.limits import MAX_EXPR_DEPTH, too_deep_message
from attnc.dsl.literals import (
    I32_MAX,
    is_i32_min_magnitude,
    name_value,
    number_value,
    string_value,
    token_loc,
)

Node = Tree[Any] | Token


def end_of_text(text: str, file: str) -> Loc:
    """The position just after the last character of ``text``."""
    lines = text.split("\n")
    col = len(lines[-1]) + 1
    return Loc(file, len(lines), col, len(lines), col)


def _tokens(children: list[Any], kind: str) -> list[Token]:
    return [c for c in children if isinstance(c, Token) and c.type == kind]


def _leaf(node: object) -> Token:
    """A child the grammar guarantees to be a token."""
    assert isinstance(node, Token), node
    return node


def _trees(children: list[Any]) -> list[Tree[Any]]:
    return [c for c in children if isinstance(c, Tree)]


class AstBuilder:
    """Builds AST nodes for one file; ``file`` goes into every location."""

    def __init__(self, file: str) -> None:
        self.file = file
        self._items: dict[str, Callable[[Tree[Any]], Any]] = {
            "import_item": self._import,
            "def_item": self._def,
            "variant": self._variant,
            "doc_item": self._doc,
            "param_item": self._param,
            "let_item": self._let,
            "assign_item": self._assign,
            "normalize_item": self._normalize,
            "kv_layout_item": self._kv_layout,
        }

    # ------------------------------------------------------------------ locations
    def loc(self, node: Node) -> Loc:
        """The span of a tree or token."""
        if isinstance(node, Token):
            return token_loc(node, self.file)
        meta = node.meta
        if meta.empty:
            return Loc(self.file, 0, 0)
        return Loc(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def _name(self, tok: Token) -> str:
        return name_value(tok, self.file)

    # ------------------------------------------------------------------ declarations
    def module(self, tree: Tree[Any]) -> ast.Module:
        """The whole file."""
        items = tuple(self._items[t.data](t) for t in _trees(tree.children))
        return ast.Module(self.file, items, loc=Loc(self.file, 1, 1))

    def _import(self, tree: Tree[Any]) -> ast.Import:
        (path,) = _tokens(tree.children, "STRING")
        return ast.Import(string_value(path, self.file), loc=self.loc(tree))

    def _def(self, tree: Tree[Any]) -> ast.Def:
        name, *params = _tokens(tree.children, "NAME")
        body = self.expr(tree.children[-1])
        return ast.Def(
            self._name(name),
            tuple(self._name(p) for p in params),
            body,
            loc=self.loc(tree),
            param_locs=tuple(self.loc(p) for p in params),
        )

    def _variant(self, tree: Tree[Any]) -> ast.Variant:
        name = _tokens(tree.children, "NAME")[0]
        items = tuple(self._items[t.data](t) for t in _trees(tree.children))
        return ast.Variant(self._name(name), items, loc=self.loc(tree))

    def _doc(self, tree: Tree[Any]) -> ast.Doc:
        (text,) = _tokens(tree.children, "STRING")
        return ast.Doc(string_value(text, self.file), loc=self.loc(tree))

    def _param(self, tree: Tree[Any]) -> ast.Param:
        _, name, type_tree, *rest = tree.children
        default = self.expr(rest[0]) if rest and rest[0] is not None else None
        return ast.Param(
            self._name(_leaf(name)), self._type(type_tree), default, loc=self.loc(tree)
        )

    def _type(self, tree: Tree[Any]) -> ast.ScalarType | ast.TensorType:
        if tree.data == "scalar_type":
            return ast.ScalarType(str(tree.children[0]), loc=self.loc(tree))
        _, elem, *dims = tree.children
        return ast.TensorType(
            str(elem), tuple(self._dim(_leaf(d)) for d in dims), loc=self.loc(tree)
        )

    def _dim(self, tok: Token) -> ast.Expr:
        if tok.type == "NAME":
            return ast.Name(self._name(tok), loc=self.loc(tok))
        value, is_float = number_value(tok, self.file)
        if is_float:
            raise AttnError(self.loc(tok), "a tensor dimension must be an integer or a name")
        return ast.Num(value, False, loc=self.loc(tok))

    def _let(self, tree: Tree[Any]) -> ast.Let:
        _, name, value = tree.children
        return ast.Let(self._name(_leaf(name)), self.expr(value), loc=self.loc(tree))

    def _assign(self, tree: Tree[Any]) -> ast.Assign:
        target, value = tree.children
        return ast.Assign(self._name(_leaf(target)), self.expr(value), loc=self.loc(tree))

    def _normalize(self, tree: Tree[Any]) -> ast.Normalize:
        (mode,) = _tokens(tree.children, "NAME")
        return ast.Normalize(self._name(mode), loc=self.loc(tree))

    def _kv_layout(self, tree: Tree[Any]) -> ast.KvLayout:
        names = _tokens(tree.children, "NAME")
        return ast.KvLayout(tuple(self._name(n) for n in names), loc=self.loc(tree))

    # ------------------------------------------------------------------ expressions
    def expr(self, node: Node, depth: int = 0) -> ast.Expr:
        """An expression tree; deeper than MAX_EXPR_DEPTH is an error at that node."""
        if not isinstance(node, Tree):
            raise AttnError(self.loc(node), "expected an expression")
        if depth > MAX_EXPR_DEPTH:
            raise AttnError(self.loc(node), too_deep_message("expression", MAX_EXPR_DEPTH))
        kids, loc = node.children, self.loc(node)
        if node.data in ("number", "true", "false", "name"):
            return self._leaf_expr(node.data, _leaf(kids[0]), loc)
        if node.data == "unary" and _is_negated_i32_min(kids):
            return ast.Num(-(I32_MAX + 1), False, loc=loc)  # -2147483648: the least i32
        subs = [
            None if k is None or isinstance(k, Token) else self.expr(k, depth + 1) for k in kids
        ]
        if node.data == "unary":
            return ast.Unary(str(kids[0]), _present(subs)[0], loc=loc)
        if node.data == "binary":
            left, right = _present(subs)
            return ast.Binary(str(kids[1]), left, right, loc=loc)
        if node.data == "ternary":
            cond, then, other = _present(subs)
            return ast.Ternary(cond, then, other, loc=loc)
        name = self._name(_leaf(kids[0]))
        if node.data == "call":
            return ast.Call(name, tuple(_present(subs)), loc=loc)
        return ast.Index(name, tuple(_present(subs)), loc=loc)

    def _leaf_expr(self, kind: str, tok: Token, loc: Loc) -> ast.Expr:
        if kind == "number":
            value, is_float = number_value(tok, self.file)
            return ast.Num(value, is_float, loc=loc)
        if kind == "name":
            return ast.Name(self._name(tok), loc=loc)
        return ast.BoolLit(kind == "true", loc=loc)


def _is_negated_i32_min(kids: list[Any]) -> bool:
    """A unary minus applied to the literal 2147483648 (out of range alone)."""
    if len(kids) != 2 or str(kids[0]) != "-":
        return False
    operand = kids[1]
    return (
        isinstance(operand, Tree)
        and operand.data == "number"
        and is_i32_min_magnitude(_leaf(operand.children[0]))
    )


def _present(exprs: list[ast.Expr | None]) -> list[ast.Expr]:
    return [e for e in exprs if e is not None]
