"""Entry points of the front end: `.attn` text -> AST.

The Lark LALR parser is built once from ``grammar.lark`` and shared. Every failure, whatever
its cause, leaves as an :class:`~attnc.dsl.errors.AttnError` with a location in the text.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lark import Lark, Tree
from lark.exceptions import LarkError

from attnc.dsl import ast
from attnc.dsl.build import AstBuilder, end_of_text
from attnc.dsl.errors import SOURCES, AttnError
from attnc.dsl.limits import MAX_EXPR_DEPTH, deep_recursion, too_deep_message
from attnc.dsl.syntax_errors import translate

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")
NESTED_TOO_DEEPLY = too_deep_message("expression", MAX_EXPR_DEPTH)


@functools.lru_cache(maxsize=2)
def grammar_parser(strict: bool = False) -> Lark:
    """The shared LALR parser with the start symbols ``module`` and ``expr_only``.

    ``strict`` (needs the optional ``interegular`` package) makes Lark reject shift/reduce
    conflicts and colliding terminals; a unit test builds it that way, so the grammar stays
    free of both and parsing without it (three times faster to build) behaves the same.
    """
    return Lark(
        GRAMMAR_PATH.read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        strict=strict,
        start=["module", "expr_only"],
    )


def _parse_tree(text: str, file: str, start: str) -> Tree[Any]:
    SOURCES.add(file, text)
    try:
        return grammar_parser().parse(text, start=start)
    except LarkError as err:
        raise translate(err, text, file) from None
    except RecursionError:
        raise AttnError(end_of_text(text, file), NESTED_TOO_DEEPLY) from None


def parse_module(text: str, file: str = "<string>") -> ast.Module:
    """Parse a whole `.attn` file into an :class:`ast.Module`."""
    tree = _parse_tree(text, file, "module")
    try:
        with deep_recursion():
            return AstBuilder(file).module(tree)
    except RecursionError:
        raise AttnError(end_of_text(text, file), NESTED_TOO_DEEPLY) from None


def parse_expr(text: str, file: str = "<string>") -> ast.Expr:
    """Parse one expression (used by tests and tools)."""
    tree = _parse_tree(text, file, "expr_only")
    try:
        with deep_recursion():
            return AstBuilder(file).expr(tree.children[0])
    except RecursionError:
        raise AttnError(end_of_text(text, file), NESTED_TOO_DEEPLY) from None
