"""Resolve ``import "file.attn";`` into an ordered list of parsed modules.

Paths are relative to the importing file and are resolved by the operating system as
written (``link/..`` is the parent of the link's target, not the importer's directory). Each
file is parsed once, however it is spelled (a file is known by its device and inode numbers,
which a symbolic link, a hard link or a bind mount to it shares), through the first spelling
met, which its own imports resolve from; a cycle, a missing or unreadable file or a chain of
imports longer than :data:`~attnc.dsl.limits.MAX_IMPORT_DEPTH` is a located error at the
import statement, and an error inside an imported file is reported there, with a note at the
import.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field

from attnc.compiler.import_paths import (
    FileId,
    ImportRecord,
    file_id,
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
    loading = _Loading(imports=[] if imports is None else imports)
    _visit(root, root.file, file_id(root.file), loading)
    return loading.ordered


@dataclass
class _Loading:
    """The state of one :func:`load_modules`."""

    ordered: list[ast.Module] = field(default_factory=list)
    # Each file loaded -> the real path it was read from, the sha256 of the bytes parsed.
    done: dict[FileId, tuple[str, str]] = field(default_factory=dict)
    # The chain of files being loaded (each importing the next), with their real paths.
    stack: list[tuple[FileId, str]] = field(default_factory=list)
    imports: list[ImportRecord] = field(default_factory=list)


def _visit(module: ast.Module, read_from: str, ident: FileId, loading: _Loading) -> None:
    """Load the imports of ``module``, the file ``ident`` read from the path ``read_from``
    (its imports resolve from there; the module's own name is the shown one, for messages
    only)."""
    loading.stack.append((ident, real_path(read_from)))
    for item in module.items:
        if isinstance(item, ast.Import):
            _load_import(item, read_from, loading)
    loading.stack.pop()
    loading.ordered.append(module)


def _load_import(item: ast.Import, importer: str, loading: _Loading) -> None:
    """Load the file that ``item``, a statement of the module read from ``importer``, names
    (unless it is loaded already: through another spelling too), and record the statement."""
    path, status = _resolve(importer, item)
    ident = file_id(path, status)
    chain = [i for i, _ in loading.stack]
    if ident in chain:
        names = [os.path.basename(real) for _, real in loading.stack[chain.index(ident) :]]
        raise AttnError(
            item.loc, f"cyclic import of '{item.path}' ({' -> '.join(names)} -> {item.path})"
        )
    if ident not in loading.done:
        if len(loading.stack) > MAX_IMPORT_DEPTH:
            raise AttnError(item.loc, too_deep_message("imports", MAX_IMPORT_DEPTH))
        imported, digest, opened = _parse_file(path, item)
        ident = file_id(path, opened)  # the file read (the one stat() named, unless swapped)
        _visit(imported, path, ident, loading)
        loading.done[ident] = (real_path(path), digest)
    record = (path, *loading.done[ident])
    if record not in loading.imports:  # a file imported twice is checked once on a cache hit
        loading.imports.append(record)


# Errors of stat() that mean no file is there; any other (no permission, a loop of links)
# is named as it is.
_ABSENT = (errno.ENOENT, errno.ENOTDIR)


def _resolve(importer: str, item: ast.Import) -> tuple[str, os.stat_result]:
    """The path ``item`` names (the importer's directory joined with it, unnormalised: the
    system resolves it), checked to be a regular file, and the file's status."""
    path = os.path.join(import_dir(importer), item.path)
    try:
        status = os.stat(path)
    except (ValueError, OSError) as exc:  # ValueError: a NUL byte
        where = plain_path(path)  # what was looked at: no ``..`` resolved by its text
        if isinstance(exc, OSError) and exc.errno not in _ABSENT:
            why = exc.strerror or str(exc)
            raise AttnError(
                item.loc, f"cannot read import '{item.path}': {why} ({where})"
            ) from None
        raise AttnError(item.loc, f"import not found: '{item.path}' (looked for {where})") from None
    if not stat.S_ISREG(status.st_mode):
        raise AttnError(item.loc, f"import is not a file: '{item.path}' ({shown_path(path)})")
    return path, status


def _parse_file(path: str, item: ast.Import) -> tuple[ast.Module, str, os.stat_result]:
    """The parsed module at ``path`` (named by :func:`shown_path`), the sha256 of the bytes
    it was parsed from and the status of the file they were read from. A file that is not a
    `.attn` file is an error at the import statement; an error in the file's text is reported
    where it is, with a note at the import statement."""
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
    digest = hashlib.sha256(data).hexdigest()
    try:
        module = _module_of(_text_of(data, path, item), path, real, opened, item)
    finally:
        del data  # not in this frame of an error's traceback
    return module, digest, opened


# The file's text stays out of an import error's traceback (whose frames keep their locals):
# the error is made in the handler of the parser's and raised out of it (raised inside, it held
# that one, with the parser's frames, as its ``__context__``), and the frames it passes through
# drop the text first.


def _text_of(data: bytes, path: str, item: ast.Import) -> str:
    """The bytes of the imported file ``path`` as text; bad UTF-8 is an error at the import,
    quoting nothing of the file (:func:`_unquoted`)."""
    try:
        return decode_source(data, path)
    except AttnError as err:
        unquoted = _unquoted(path, item, err)
    del data
    raise unquoted


def _module_of(
    text: str, path: str, real: str, opened: os.stat_result, item: ast.Import
) -> ast.Module:
    """The module ``text`` of ``path`` parses to. An error in it is reported where it is, with
    a note at the import, when the file may be quoted (:func:`_quotable`), else at the import
    alone (:func:`_unquoted`)."""
    try:
        return parse_module(text, path)
    except AttnError as err:
        if _quotable(real, opened):
            imported_here = note(item.loc, f"in the file imported here as '{item.path}'")
            error = AttnError(err.loc, err.message, (*err.notes, imported_here))
        else:
            error = _unquoted(path, item, err)
    del text
    raise error


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
