"""Front end: `.attn` text -> AST (grammar, parser, AST nodes, located errors, printer).

The parser and printer load on first use (importing Lark costs tens of milliseconds that a
cached ``attnc.load`` does not need).
"""

from __future__ import annotations

from typing import Any

from attnc.dsl.errors import AttnError, Loc

__all__ = ["AttnError", "Loc", "format_expr", "format_module", "parse_expr", "parse_module"]

_LAZY = {
    "parse_expr": "attnc.dsl.parser",
    "parse_module": "attnc.dsl.parser",
    "format_expr": "attnc.dsl.printer",
    "format_module": "attnc.dsl.printer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnc.dsl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
