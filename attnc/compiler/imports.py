"""Resolve ``import "file.attn";`` into an ordered list of parsed modules.

Paths are relative to the importing file. Each file is parsed once; a cycle, a missing file
or a chain of imports longer than :data:`~attnc.dsl.limits.MAX_IMPORT_DEPTH` is a located
error at the import statement.
"""

from __future__ import annotations

import hashlib
import os

from attnc.dsl import ast
from attnc.dsl.errors import SOURCES, AttnError
from attnc.dsl.limits import MAX_IMPORT_DEPTH, MAX_SOURCE_BYTES, too_deep_message
from attnc.dsl.parser import parse_module
from attnc.dsl.source_text import decode_source
from attnc.regular_file import read_regular

ATTN_SUFFIX = ".attn"


def load_modules(root: ast.Module, digests: dict[str, str] | None = None) -> list[ast.Module]:
    """``root`` and every module it imports, transitively; imported modules come first.
    ``digests`` (when given) receives the sha256 of the bytes each imported file was parsed
    from, by its path: what a cache of the result must find there again."""
    ordered: list[ast.Module] = []
    done: set[str] = set()
    _visit(root, ordered, done, [], {} if digests is None else digests)
    return ordered


def _visit(
    module: ast.Module,
    ordered: list[ast.Module],
    done: set[str],
    stack: list[str],
    digests: dict[str, str],
) -> None:
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
            if len(stack) > MAX_IMPORT_DEPTH:
                raise AttnError(item.loc, too_deep_message("imports", MAX_IMPORT_DEPTH))
            _visit(_parse_file(path, item, digests), ordered, done, stack, digests)
    stack.pop()
    done.add(key)
    ordered.append(module)


def _canonical(path: str) -> str:
    if path.startswith("<"):
        return path
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):  # e.g. a NUL character: no such file can exist
        return path


def _resolve(importer: str, item: ast.Import) -> str:
    base = os.getcwd() if importer.startswith("<") else os.path.dirname(os.path.abspath(importer))
    path = os.path.normpath(os.path.join(base, item.path))
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise AttnError(item.loc, f"import is not a file: '{item.path}' ({path})")
        raise AttnError(item.loc, f"import not found: '{item.path}' (looked for {path})")
    return path


def _parse_file(path: str, item: ast.Import, digests: dict[str, str]) -> ast.Module:
    """The parsed module at ``path``. A file that is not UTF-8 `.attn` text is an error at the
    import statement that names where parsing stopped but never quotes the file's content."""
    if not path.endswith(ATTN_SUFFIX):
        raise AttnError(item.loc, f"cannot import '{item.path}': only {ATTN_SUFFIX} files")
    try:
        data = read_regular(path, MAX_SOURCE_BYTES, "an import is a file")
    except OSError as exc:
        raise AttnError(item.loc, f"cannot read import '{item.path}': {exc.strerror}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise AttnError(
            item.loc, f"cannot import '{item.path}': larger than {MAX_SOURCE_BYTES} bytes"
        )
    digests[path] = hashlib.sha256(data).hexdigest()
    try:
        return parse_module(decode_source(data, path), path)
    except AttnError as err:
        SOURCES.forget(path)
        where = f"line {err.loc.line}, column {err.loc.col}"
        raise AttnError(
            item.loc, f"cannot import '{item.path}': it is not valid .attn text ({where})"
        ) from None
