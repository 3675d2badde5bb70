"""Lark's parse errors rewritten as located errors in plain words."""

from __future__ import annotations

from typing import Any

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

from attnc.dsl.build import end_of_text
from attnc.dsl.errors import AttnError, Loc, printable

# How each terminal is called in a message, in the order alternatives are listed.
TERMINAL_WORDS: dict[str, str] = {
    "SEMICOLON": "';'",
    "COMMA": "','",
    "RPAR": "')'",
    "RSQB": "']'",
    "RBRACE": "'}'",
    "COLON": "':'",
    "ASSIGN": "'='",
    "LPAR": "'('",
    "LSQB": "'['",
    "LBRACE": "'{'",
    "BAR": "'|'",
    "QMARK": "'?'",
    "OROR": "'||'",
    "ANDAND": "'&&'",
    "EQ": "'=='",
    "NE": "'!='",
    "LT": "'<'",
    "LE": "'<='",
    "GT": "'>'",
    "GE": "'>='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "PERCENT": "'%'",
    "BANG": "'!'",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "TRUE": "'true'",
    "FALSE": "'false'",
    "IMPORT": "'import'",
    "DEF": "'def'",
    "VARIANT": "'variant'",
    "DOC": "'doc'",
    "PARAM": "'param'",
    "LET": "'let'",
    "NORMALIZE": "'normalize'",
    "KV_LAYOUT": "'kv_layout'",
    "F32": "'f32'",
    "I32": "'i32'",
    "BOOL": "'bool'",
    "TENSOR": "'tensor'",
    "$END": "end of file",
}

EXPR_START = frozenset({"NAME", "NUMBER", "LPAR", "MINUS", "BANG", "PLUS", "TRUE", "FALSE"})
# Tokens that may continue a finished expression.
CONTINUATIONS = frozenset(
    {"QMARK", "OROR", "ANDAND", "EQ", "NE", "LT", "LE", "GT", "GE"}
    | {"PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "LPAR", "LSQB"}
)
ITEM_START = frozenset({"DOC", "PARAM", "LET", "NORMALIZE", "KV_LAYOUT"})
TOP_START = frozenset({"IMPORT", "DEF", "VARIANT"})
TOP_WORDS = frozenset({"import", "def", "variant"})  # how they are spelled
TYPE_START = frozenset({"F32", "I32", "BOOL", "TENSOR"})


def _found(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    text = printable(str(tok))
    return f"'{text if len(text) <= 24 else text[:21] + '...'}'"


def _alternatives(names: set[str]) -> str:
    order = list(TERMINAL_WORDS)
    words = [TERMINAL_WORDS[n] for n in sorted(names, key=order.index) if n in TERMINAL_WORDS]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


def _open_variant(stack: list[Any]) -> str | None:
    """The name of the variant whose '{' has not been closed, if any."""
    for i in range(len(stack) - 1, 0, -1):
        item = stack[i - 1]
        if isinstance(item, Token) and item.type == "VARIANT":
            return str(stack[i])
    return None


EXPR_TREES = frozenset(
    {"number", "true", "false", "name", "unary", "binary", "ternary", "call", "index"}
)


def _ends_expression(stack: list[Any]) -> bool:
    """Whether the parser has just finished reading an expression."""
    top = stack[-1] if stack else None
    return isinstance(top, Tree) and top.data in EXPR_TREES


def _expected(expected: set[str], found: Token, stack: list[Any]) -> str:
    """What the parser wanted, in words."""
    if expected >= {"NUMBER", "LPAR"}:
        rest = _alternatives(expected - EXPR_START)
        return "an expression" + (f" or {rest}" if rest else "")
    if (expected & CONTINUATIONS or _ends_expression(stack)) and expected - CONTINUATIONS:
        return f"{_alternatives(expected - CONTINUATIONS)} after the expression"
    if expected >= ITEM_START:
        name = _open_variant(stack)
        if found.type == "$END" and name is not None:
            return f"'}}' to close variant '{name}'"
        return "a variant item (doc, param, let, normalize, kv_layout or an assignment) or '}'"
    if expected >= TOP_START:
        return "'variant', 'def' or 'import'"
    if expected == TYPE_START:
        return "a type (f32, i32, bool or tensor<...>)"
    return _alternatives(expected) or "something else"


def _stack_end(stack: list[Any]) -> tuple[int, int] | None:
    """Where the last thing the parser accepted ends."""
    if not stack:
        return None
    top = stack[-1]
    if isinstance(top, Token) and top.end_line is not None and top.end_column is not None:
        return top.end_line, top.end_column
    if isinstance(top, Tree) and not top.meta.empty:
        return top.meta.end_line, top.meta.end_column
    return None


def _accepted(err: UnexpectedToken) -> set[str]:
    """Terminals the parser would really take here (LALR tables over-approximate)."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except LarkError:
            pass
    return set(err.expected)


def _unclosed_before_top_item(stack: list[Any], file: str) -> AttnError | None:
    """The error of a variant left open before the next top-level item: inside a variant the
    lexer reads ``variant``, ``def`` and ``import`` as names (the start of an assignment),
    so the parser stops one token later ("expected '=', found 'b'"). Located at that word."""
    top = stack[-1] if stack else None
    if not (isinstance(top, Token) and top.type == "NAME" and str(top) in TOP_WORDS):
        return None
    name = _open_variant(stack)
    if name is None:
        return None
    loc = Loc(file, top.line or 1, top.column or 1, top.end_line or 0, top.end_column or 0)
    return AttnError(loc, f"expected '}}' to close variant '{name}' before '{top}'")


def _token_error(err: UnexpectedToken, text: str, file: str) -> AttnError:
    tok = err.token
    state = getattr(err, "state", None)
    stack = list(getattr(state, "value_stack", None) or [])
    unclosed = _unclosed_before_top_item(stack, file)
    if unclosed is not None:
        return unclosed
    message = f"expected {_expected(_accepted(err), tok, stack)}, found {_found(tok)}"
    if message.startswith("expected '}' to close"):
        message = message.split(", found")[0]
    prev = _stack_end(stack)
    if tok.type == "$END":
        loc = Loc(file, *prev, *prev) if prev else end_of_text(text, file)
    elif prev is not None and prev[0] < (tok.line or 0) and "after" in message:
        loc = Loc(file, *prev, *prev)
    else:
        loc = Loc(file, tok.line or 1, tok.column or 1, tok.end_line or 0, tok.end_column or 0)
    return AttnError(loc, message)


def _char_error(err: UnexpectedCharacters, text: str, file: str) -> AttnError:
    line, col, pos = err.line or 1, err.column or 1, err.pos_in_stream or 0
    char = text[pos] if 0 <= pos < len(text) else ""
    if char == '"':
        rest = text[pos:].split("\n", 1)[0]
        return AttnError(Loc(file, line, col, line, col + len(rest)), "unterminated string")
    return AttnError(
        Loc(file, line, col, line, col + 1), f"unexpected character '{printable(char)}'"
    )


def translate(err: LarkError, text: str, file: str) -> AttnError:
    """One located error in plain words for any Lark parse error."""
    if isinstance(err, UnexpectedToken):
        return _token_error(err, text, file)
    if isinstance(err, UnexpectedCharacters):
        return _char_error(err, text, file)
    if isinstance(err, UnexpectedEOF):
        return AttnError(end_of_text(text, file), "unexpected end of file")
    return AttnError(end_of_text(text, file), "syntax error")
