"""Owns: what an ``import "path";`` names on disk, without the parser (a cached load checks
these and must not import Lark): the directory a source's imports resolve from, a file's
identity (its device and inode numbers), the name an import is shown by, and the record a
cache of the compile keeps for each import statement."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TypeAlias

# What a cache of a compile must find again for each import statement: the path as the
# statement resolved it (the importer's directory joined with what it wrote, left to the
# system to resolve), the module it named (the real path of the file the module was read
# from: the same for every spelling of one file, a symbolic link, a hard link or a bind
# mount) and the sha256 of the bytes that module was parsed from.
ImportRecord = tuple[str, str, str]

# The identity that decides whether two spellings are one module: the file's device and
# inode numbers, else (inline source, no such file) its name or real path.
FileId: TypeAlias = tuple[int, int] | str


def real_path(path: str) -> str:
    """The real path of the file at ``path`` (an inline source's ``<...>`` name as it is)."""
    if path.startswith("<"):
        return path
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):  # e.g. a NUL character: no such file can exist
        return path


def file_id(path: str, status: os.stat_result | None = None) -> FileId:
    """The identity of the file at ``path`` (``status``: its status, when taken already):
    its device and inode numbers, which every spelling of one file shares (a symbolic link,
    a hard link, a bind mount); an inline source's ``<...>`` name, or the real path of a
    path no file answers (or one the system gives no inode number), otherwise."""
    if path.startswith("<"):
        return path
    try:
        status = os.stat(path) if status is None else status
    except (OSError, ValueError):
        return real_path(path)
    return (status.st_dev, status.st_ino) if status.st_ino else real_path(path)


def same_modules(imports: Iterable[ImportRecord]) -> bool:
    """Whether the path of every record still names a file, the records of one module one
    file and those of different modules different files (a link replaced by a copy, or a
    copy by a link, changes which imports are one module)."""
    now: dict[str, FileId] = {}
    for path, module, _ in imports:
        try:
            found = file_id(path, os.stat(path))
        except (OSError, ValueError):
            return False
        if now.setdefault(module, found) != found:
            return False
    return len(set(now.values())) == len(now)


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


def shown_path(path: str) -> str:
    """The name the file at ``path`` goes by in messages and diagnostics (its own imports
    resolve from ``path`` itself): ``path`` normalised (``a/./b/../c`` as ``a/c``) when both
    spellings name the same file in the same directory, else as it is (a link makes ``..``
    mean something else; ``missing/../x`` names nothing)."""
    tidy = os.path.normpath(path)
    if tidy == path:
        return path
    try:
        same = all(
            os.path.samestat(os.stat(a), os.stat(b))
            for a, b in ((path, tidy), (os.path.dirname(path), os.path.dirname(tidy)))
        )
    except (OSError, ValueError):
        return path
    return tidy if same else path


def plain_path(path: str) -> str:
    """``path`` without its ``.`` components and repeated separators, which mean nothing to
    the system; ``..`` and a trailing separator are kept (their meaning depends on links)."""
    head = os.sep if path.startswith(os.sep) else ""
    parts = [p for p in path.split(os.sep) if p not in ("", ".")]
    tail = os.sep if path.endswith(os.sep) and parts else ""
    return head + os.sep.join(parts) + tail or "."
