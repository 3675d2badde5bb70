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

from attnc.dsl import ast
from attnc.dsl.errors import SOURCES, AttnError, note
from attnc.dsl.limits import MAX_IMPORT_DEPTH, MAX_SOURCE_BYTES, too_deep_message
from attnc.dsl.parser import parse_module
from attnc.dsl.source_text import decode_source
from attnc.regular_file import read_regular

ATTN_SUFFIX = ".attn"


# What a cache of a compile must find again for each import statement: the path the
# statement resolved to, the file it named (its real path: the identity that decides whether
# two spellings are one module) and the sha256 of the bytes that file was parsed from.
ImportRecord = tuple[str, str, str]


def load_modules(root: ast.Module, imports: list[ImportRecord] | None = None) -> list[ast.Module]:
    """``root`` and every module it imports, transitively; imported modules come first.
    ``imports`` (when given) receives an :data:`ImportRecord` for every import statement
    (one skipped as already loaded too), in the order they were met."""
    ordered: list[ast.Module] = []
    done: dict[str, str] = {}  # real path -> sha256 of the bytes parsed
    _visit(root, ordered, done, [], [] if imports is None else imports)
    return ordered


def _visit(
    module: ast.Module,
    ordered: list[ast.Module],
    done: dict[str, str],
    stack: list[str],
    imports: list[ImportRecord],
) -> None:
    stack.append(real_path(module.file))
    for item in module.items:
        if isinstance(item, ast.Import):
            path = _resolve(module.file, item)
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
                _visit(imported, ordered, done, stack, imports)
                done[canon] = digest
            record = (path, canon, done[canon])
            if record not in imports:  # a file imported twice is checked once on a cache hit
                imports.append(record)
    stack.pop()
    ordered.append(module)


def real_path(path: str) -> str:
    """The identity of the file at ``path`` (its real path; an inline source's ``<...>`` name
    as it is): two spellings of one file are one module."""
    if path.startswith("<"):
        return path
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):  # e.g. a NUL character: no such file can exist
        return path


def import_dir(importer: str) -> str:
    """The directory the imports of ``importer`` resolve from, unnormalised (the operating
    system resolves ``..`` after a symbolic link): its own directory, or the working
    directory for inline source (a ``<...>`` name; a file whose path starts with ``<`` is
    named ``./<...`` by :func:`attnc.compiler.sources.resolve_source`)."""
    if importer.startswith("<"):
        return _working_dir()
    if os.path.isabs(importer):
        return os.path.dirname(importer)
    return os.path.dirname(os.path.join(_working_dir(), importer))


def _working_dir() -> str:
    """The working directory, or ``.`` when it has been removed (a relative import then
    finds nothing, as the system would; a source without imports still loads)."""
    try:
        return os.getcwd()
    except OSError:
        return "."


def _tidy(path: str) -> str:
    """``path`` normalised for showing and naming (``a/./b/../c`` as ``a/c``) when that
    names the same file; as it is when a link makes ``..`` mean something else."""
    tidy = os.path.normpath(path)
    if tidy == path or path.endswith(os.sep):  # ``lib.attn/`` names no file; its tidy form does
        return path
    return tidy if real_path(tidy) == real_path(path) else path


# Errors of stat() that mean no file is there; any other (no permission, a loop of links)
# is named as it is.
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def _resolve(importer: str, item: ast.Import) -> str:
    path = _tidy(os.path.join(import_dir(importer), item.path))
    try:
        mode = os.stat(path).st_mode
    except (ValueError, OSError) as exc:  # ValueError: a NUL byte
        if isinstance(exc, OSError) and exc.errno not in _ABSENT:
            why = exc.strerror or str(exc)
            raise AttnError(item.loc, f"cannot read import '{item.path}': {why} ({path})") from None
        raise AttnError(item.loc, f"import not found: '{item.path}' (looked for {path})") from None
    if not stat.S_ISREG(mode):
        raise AttnError(item.loc, f"import is not a file: '{item.path}' ({path})")
    return path


def _parse_file(path: str, item: ast.Import) -> tuple[ast.Module, str]:
    """The parsed module at ``path`` and the sha256 of the bytes it was parsed from. A file
    that is not a `.attn` file is an error at the import statement; an error in the file's
    text is reported where it is, with a note at the import statement."""
    if not path.endswith(ATTN_SUFFIX):
        raise AttnError(item.loc, f"cannot import '{item.path}': only {ATTN_SUFFIX} files")
    real = real_path(path)
    try:  # the real file, not through a link swapped in since: what is read is what is named
        data = read_regular(real, MAX_SOURCE_BYTES, "an import is a file", follow_link=False)
    except OSError as exc:
        raise AttnError(item.loc, f"cannot read import '{item.path}': {exc.strerror}") from None
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
        if not real.endswith(ATTN_SUFFIX):
            raise _unquoted(path, item, err) from None
        imported_here = note(item.loc, f"in the file imported here as '{item.path}'")
        raise AttnError(err.loc, err.message, (*err.notes, imported_here)) from None
    return module, hashlib.sha256(data).hexdigest()


def _unquoted(path: str, item: ast.Import, err: AttnError) -> AttnError:
    """The error of imported bytes that are not UTF-8 text, or of a link to a file of
    another name (``pw.attn`` to a password file) that does not parse: at the import
    statement, by the position alone, never quoting the file. (UTF-8 text in a file whose
    real name ends in ``.attn`` gets the parser's own error, with a note at the import.)"""
    SOURCES.forget(path)
    where = f"line {err.loc.line}, column {err.loc.col}"
    return AttnError(item.loc, f"cannot import '{item.path}': it is not valid .attn text ({where})")
