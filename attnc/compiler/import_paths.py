"""Owns: what an ``import "path";`` names on disk, without the parser (a cached load checks
these and must not import Lark): the directory a source's imports resolve from, a file's
identity (its real path), the name an import is shown by, and the record a cache of the
compile keeps for each import statement."""

from __future__ import annotations

import os

# What a cache of a compile must find again for each import statement: the path as the
# statement resolved it (the importer's directory joined with what it wrote, left to the
# system to resolve), the file it named (its real path: the identity that decides whether two
# spellings are one module) and the sha256 of the bytes that file was parsed from.
ImportRecord = tuple[str, str, str]


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
