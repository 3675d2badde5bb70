"""Front end: `.attn` text -> AST (grammar, parser, AST nodes, located errors, printer)."""

from attnc.dsl.errors import AttnError, Loc
from attnc.dsl.parser import parse_expr, parse_module
from attnc.dsl.printer import format_expr, format_module

__all__ = ["AttnError", "Loc", "format_expr", "format_module", "parse_expr", "parse_module"]
