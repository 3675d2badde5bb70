"""A disk cache of compiled variants, so loading a variant compiled before skips the parser
and SymPy (a cached ``attnc.load`` takes milliseconds instead of about a second).

An entry is keyed by the source text, its file name and a fingerprint of the compiler (the
sources of ``attnc.dsl``, ``attnc.compiler`` and the grammar); it records the digests of the
files the source imported and is used only while they are unchanged. Entries live in
``$ATTNC_CACHE_DIR/compiled`` and are written atomically; an unreadable entry is ignored
and rewritten. ``ATTNC_COMPILE_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from attnc.compiler.results import Compiled, remember
from attnc.dsl.errors import SOURCES, Diagnostic
from attnc.runtime.build.cache import cache_dir
from attnc.version import PACKAGE_DIR

FORMAT = 1  # bump when the entry layout changes


@dataclass(frozen=True)
class _Entry:
    imports: tuple[tuple[str, str], ...]  # (path, sha256 of its bytes)
    compiled: tuple[Compiled, ...]
    warnings: tuple[Diagnostic, ...]


def enabled() -> bool:
    """False when ``ATTNC_COMPILE_CACHE=0`` (or empty)."""
    return os.environ.get("ATTNC_COMPILE_CACHE", "1") not in ("0", "")


@lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """sha256 over the front and middle end's sources (any change invalidates entries)."""
    root = PACKAGE_DIR
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for sub in ("dsl", "compiler"):
        for path in sorted((root / sub).rglob("*")):
            if path.suffix in (".py", ".lark") and path.is_file():
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def _file_digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _entry_path(text: str, file: str) -> Path:
    h = hashlib.sha256(compiler_fingerprint().encode())
    h.update(file.encode() + b"\0" + text.encode())
    return cache_dir() / "compiled" / f"{h.hexdigest()}.pkl"


def _read(path: Path) -> _Entry | None:
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError):
        return None
    if not isinstance(entry, _Entry):
        return None
    if any(_file_digest(p) != digest for p, digest in entry.imports):
        return None
    return entry


def _write(path: Path, entry: _Entry) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache only costs speed


def compile_cached(text: str, file: str) -> tuple[list[Compiled], tuple[Diagnostic, ...]]:
    """``attnc.compiler.pipeline.compile_source``, through the cache."""
    if enabled():
        path = _entry_path(text, file)
        entry = _read(path)
        if entry is not None:
            SOURCES.add(file, text)  # error carets of later diagnostics show the line
            return [remember(c) for c in entry.compiled], entry.warnings
    from attnc.compiler.pipeline import compile_with_imports

    compiled, warnings, imported = compile_with_imports(text, file)
    if enabled():
        digests = tuple((p, _file_digest(p)) for p in imported)
        if all(d is not None for _, d in digests):
            _write(path, _Entry(digests, tuple(compiled), warnings))  # type: ignore[arg-type]
    return compiled, warnings
