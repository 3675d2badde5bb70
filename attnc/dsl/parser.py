"""Entry points of the front end: `.attn` text -> AST.

The Lark LALR parser is built once from ``grammar.lark`` and shared. Every failure, whatever
its cause, leaves as an :class:`~attnc.dsl.errors.AttnError` with a location in the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lark import Lark, Tree
from lark.exceptions import LarkError

from attnc.dsl import ast
from attnc.dsl.build import AstBuilder, end_of_text
from attnc.dsl.errors import SOURCES, AttnError, Loc, SourceName
from attnc.dsl.limits import MAX_EXPR_DEPTH, deep_recursion, too_deep_message
from attnc.dsl.parser_cache import cached_parser
from attnc.dsl.syntax_errors import translate

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")
NESTED_TOO_DEEPLY = too_deep_message("expression", MAX_EXPR_DEPTH)
T = TypeVar("T")
# The Lark options of the shared parser (also part of its cache key, parser_cache.py).
PARSER_OPTIONS: dict[str, Any] = {
    "parser": "lalr",
    "lexer": "contextual",
    "propagate_positions": True,
    "maybe_placeholders": True,
    "start": ["module", "expr_only"],
}


@functools.lru_cache(maxsize=2)
def grammar_parser(strict: bool = False) -> Lark:
    """The shared LALR parser with the start symbols ``module`` and ``expr_only``.

    ``strict`` (needs the optional ``interegular`` package) makes Lark reject shift/reduce
    conflicts and colliding terminals; a unit test builds it that way, so the grammar stays
    free of both and parsing without it (three times faster to build) behaves the same. The
    parser without ``strict`` is kept on disk between processes (``parser_cache.py``).
    """
    grammar = GRAMMAR_PATH.read_text(encoding="utf-8")
    if strict:
        return Lark(grammar, strict=True, **PARSER_OPTIONS)
    return cached_parser(grammar, PARSER_OPTIONS, lambda: Lark(grammar, **PARSER_OPTIONS))


def _parse(text: str, file: str, start: str, build: Callable[[AstBuilder, Tree[Any]], T]) -> T:
    """``build(builder, tree)`` on the parse tree of ``text`` from the rule ``start``; syntax
    errors and nesting too deep for Python's stack leave as :class:`AttnError`. Every
    location names the file by a :class:`~attnc.dsl.errors.SourceName` referring to ``text``,
    so its diagnostics quote this text whichever thread makes them; the reference is weak,
    and the result holds the text (as ``_source_text``), so the text lives as long as it (or
    this thread's map of recent files, or a variant loaded from it) does."""
    source = SOURCES.add(file, text)
    file = SourceName(file, source)
    _refuse_lone_cr(text, file)
    try:
        tree = grammar_parser().parse(text, start=start)
    except LarkError as err:
        raise translate(err, text, file) from None
    except RecursionError:
        raise AttnError(end_of_text(text, file), NESTED_TOO_DEEPLY) from None
    try:
        with deep_recursion():
            built = build(AstBuilder(file), tree)
    except RecursionError:
        raise AttnError(end_of_text(text, file), NESTED_TOO_DEEPLY) from None
    object.__setattr__(built, "_source_text", source)
    return built


_LONE_CR = re.compile(r"\r(?!\n)")


def _refuse_lone_cr(text: str, file: str) -> None:
    """A carriage return not before a line feed (CR-only line ends, old Mac files) is an
    error at it: taken for a space, it left a ``#`` comment running to the end of the file,
    which swallowed every variant after it without a word."""
    found = _LONE_CR.search(text)
    if found is None:
        return
    line = text.count("\n", 0, found.start()) + 1
    col = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    raise AttnError(
        Loc(file, line, col, line, col + 1),
        "a carriage return not followed by a line feed: .attn lines end with LF or CRLF",
    )


def parse_module(text: str, file: str = "<string>") -> ast.Module:
    """Parse a whole `.attn` file into an :class:`ast.Module`, whose locations keep the text
    quotable in error messages while the module lives: the module holds the text, its
    locations refer to it (:class:`attnc.dsl.errors.SourceName`)."""
    return _parse(text, file, "module", lambda builder, tree: builder.module(tree))


def parse_expr(text: str, file: str = "<string>") -> ast.Expr:
    """Parse one expression (used by tests and tools), which holds the text its locations
    quote, as a module does."""
    return _parse(text, file, "expr_only", lambda builder, tree: builder.expr(tree.children[0]))
