"""Resolve ``import "file.attn";`` into an ordered list of parsed modules.

Paths are relative to the importing file and are resolved by the operating system as
written (``link/..`` is the parent of the link's target, not the importer's directory). Each
file is parsed once, however it is spelled; a cycle, a missing or unreadable file or a chain
of imports longer than :data:`~attnc.dsl.limits.MAX_IMPORT_DEPTH` is a located error at the
import statement, and an error inside an imported file is reported there, with a note at the
import.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from attnc.compiler.import_paths import (
    ImportRecord,
    import_dir,
    plain_path,
    real_path,
    shown_path,
)
from attnc.dsl import ast
from attnc.dsl.errors import SOURCES, AttnError, note
from attnc.dsl.limits import MAX_IMPORT_DEPTH, MAX_SOURCE_BYTES, too_deep_message
from attnc.dsl.parser import parse_module
from attnc.dsl.source_text import decode_source
from attnc.regular_file import read_regular_file

ATTN_SUFFIX = ".attn"


def load_modules(root: ast.Module, imports: list[ImportRecord] | None = None) -> list[ast.Module]:
    """``root`` and every module it imports, transitively; imported modules come first.
    ``imports`` (when given) receives an :data:`ImportRecord` for every import statement
    (one skipped as already loaded too), in the order they were met."""
    ordered: list[ast.Module] = []
    done: dict[str, str] = {}  # real path -> sha256 of the bytes parsed
    _visit(root, root.file, ordered, done, [], [] if imports is None else imports)
    return ordered


def _visit(
    module: ast.Module,
    read_from: str,
    ordered: list[ast.Module],
    done: dict[str, str],
    stack: list[str],
    imports: list[ImportRecord],
) -> None:
    """Load the imports of ``module``, read from the path ``read_from`` (its imports resolve
    from there; the module's own name is the shown one, for messages only)."""
    stack.append(real_path(read_from))
    for item in module.items:
        if isinstance(item, ast.Import):
            path = _resolve(read_from, item)
            canon = real_path(path)
            if canon in stack:
                chain = " -> ".join(os.path.basename(p) for p in stack[stack.index(canon) :])
                raise AttnError(
                    item.loc, f"cyclic import of '{item.path}' ({chain} -> {item.path})"
                )
            if canon not in done:
                if len(stack) > MAX_IMPORT_DEPTH:
                    raise AttnError(item.loc, too_deep_message("imports", MAX_IMPORT_DEPTH))
                imported, digest = _parse_file(path, item)
                _visit(imported, path, ordered, done, stack, imports)
                done[canon] = digest
            record = (path, canon, done[canon])
            if record not in imports:  # a file imported twice is checked once on a cache hit
                imports.append(record)
    stack.pop()
    ordered.append(module)


# Errors of stat() that mean no file is there; any other (no permission, a loop of links)
# is named as it is.
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def _resolve(importer: str, item: ast.Import) -> str:
    """The path ``item`` names (the importer's directory joined with it, unnormalised: the
    system resolves it), checked to be a regular file."""
    path = os.path.join(import_dir(importer), item.path)
    try:
        mode = os.stat(path).st_mode
    except (ValueError, OSError) as exc:  # ValueError: a NUL byte
        where = plain_path(path)  # what was looked at: no ``..`` resolved by its text
        if isinstance(exc, OSError) and exc.errno not in _ABSENT:
            why = exc.strerror or str(exc)
            raise AttnError(
                item.loc, f"cannot read import '{item.path}': {why} ({where})"
            ) from None
        raise AttnError(item.loc, f"import not found: '{item.path}' (looked for {where})") from None
    if not stat.S_ISREG(mode):
        raise AttnError(item.loc, f"import is not a file: '{item.path}' ({shown_path(path)})")
    return path


def _parse_file(path: str, item: ast.Import) -> tuple[ast.Module, str]:
    """The parsed module at ``path`` (named by :func:`shown_path`) and the sha256 of the
    bytes it was parsed from. A file that is not a `.attn` file is an error at the import
    statement; an error in the file's text is reported where it is, with a note at the
    import statement."""
    if not path.endswith(ATTN_SUFFIX):
        raise AttnError(item.loc, f"cannot import '{item.path}': only {ATTN_SUFFIX} files")
    try:
        data, opened = read_regular_file(path, MAX_SOURCE_BYTES, "an import is a file")
    except OSError as exc:
        raise AttnError(item.loc, f"cannot read import '{item.path}': {exc.strerror}") from None
    real, path = real_path(path), shown_path(path)
    if len(data) > MAX_SOURCE_BYTES:
        raise AttnError(
            item.loc, f"cannot import '{item.path}': larger than {MAX_SOURCE_BYTES} bytes"
        )
    try:
        text = decode_source(data, path)
    except AttnError as err:
        raise _unquoted(path, item, err) from None
    try:
        module = parse_module(text, path)
    except AttnError as err:
        if not _quotable(real, opened):
            raise _unquoted(path, item, err) from None
        imported_here = note(item.loc, f"in the file imported here as '{item.path}'")
        raise AttnError(err.loc, err.message, (*err.notes, imported_here)) from None
    return module, hashlib.sha256(data).hexdigest()


def _quotable(real: str, opened: os.stat_result) -> bool:
    """Whether the text of the file read (``opened``: its status) may be quoted: its real
    name ends in ``.attn`` and it is that file still (not a link swapped in meanwhile)."""
    if not real.endswith(ATTN_SUFFIX):
        return False
    try:
        return os.path.samestat(opened, os.stat(real))
    except (OSError, ValueError):
        return False


def _unquoted(path: str, item: ast.Import, err: AttnError) -> AttnError:
    """The error of imported bytes that are not UTF-8 text, or of a link to a file of
    another name (``pw.attn`` to a password file) that does not parse: at the import
    statement, by the position alone, never quoting the file. (UTF-8 text in a file whose
    real name ends in ``.attn`` gets the parser's own error, with a note at the import.)"""
    SOURCES.forget(path)
    where = f"line {err.loc.line}, column {err.loc.col}"
    return AttnError(item.loc, f"cannot import '{item.path}': it is not valid .attn text ({where})")
