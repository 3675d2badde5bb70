"""Resolve ``import "file.attn";`` into an ordered list of parsed modules.

Paths are relative to the importing file. Each file is parsed once; a cycle or a missing
file is a located error at the import statement.
"""

from __future__ import annotations

import os

from attnc.dsl import ast
from attnc.dsl.errors import AttnError
from attnc.dsl.parser import parse_module


def load_modules(root: ast.Module) -> list[ast.Module]:
    """``root`` and every module it imports, transitively; imported modules come first."""
    ordered: list[ast.Module] = []
    done: set[str] = set()
    _visit(root, ordered, done, stack=[])
    return ordered


def _visit(module: ast.Module, ordered: list[ast.Module], done: set[str], stack: list[str]) -> None:
    key = _canonical(module.file)
    stack.append(key)
    for item in module.items:
        if isinstance(item, ast.Import):
            path = _resolve(module.file, item)
            canon = _canonical(path)
            if canon in stack:
                chain = " -> ".join(os.path.basename(p) for p in stack[stack.index(canon) :])
                raise AttnError(
                    item.loc, f"cyclic import of '{item.path}' ({chain} -> {item.path})"
                )
            if canon in done:
                continue
            _visit(_parse_file(path, item), ordered, done, stack)
    stack.pop()
    done.add(key)
    ordered.append(module)


def _canonical(path: str) -> str:
    if path.startswith("<"):
        return path
    return os.path.realpath(path)


def _resolve(importer: str, item: ast.Import) -> str:
    base = os.getcwd() if importer.startswith("<") else os.path.dirname(os.path.abspath(importer))
    path = os.path.normpath(os.path.join(base, item.path))
    if not os.path.isfile(path):
        raise AttnError(item.loc, f"import not found: '{item.path}' (looked for {path})")
    return path


def _parse_file(path: str, item: ast.Import) -> ast.Module:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise AttnError(item.loc, f"cannot read import '{item.path}': {exc}") from None
    return parse_module(text, path)
