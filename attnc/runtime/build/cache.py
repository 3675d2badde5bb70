"""The on-disk build cache: where modules live, how they are keyed, and how they are written.

A module's directory is ``<cache dir>/<readable name>_<hash prefix>``; the hash covers
everything that changes the binary. Files are rewritten only when their content changes, and
builds of one key are serialised by an ``fcntl`` lock on a file next to the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnc.version import PACKAGE_DIR, __version__

INCLUDE_DIR = PACKAGE_DIR / "kernels" / "include"


def cache_dir() -> Path:
    """The cache root: ``$ATTNC_CACHE_DIR`` or ``~/.cache/attnc``."""
    env = os.environ.get("ATTNC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnc"


def header_digest(include_dir: Path = INCLUDE_DIR) -> str:
    """sha256 over the relative path and contents of every file under ``include_dir``."""
    h = hashlib.sha256()
    if include_dir.is_dir():
        for path in sorted(p for p in include_dir.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(include_dir)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def safe_name(name: str) -> str:
    """``name`` reduced to ``[A-Za-z0-9_]`` so it can be a file and directory name."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_")
    return cleaned[:80] or "module"


def cache_key(name: str, source: str, flags: Sequence[str], arch: str, headers: str) -> str:
    """Readable name plus the first 16 hex digits of the hash of every build input."""
    h = hashlib.sha256()
    for part in (source, headers, "\x1f".join(flags), arch, __version__):
        h.update(part.encode())
        h.update(b"\0")
    return f"{safe_name(name)}_{h.hexdigest()[:16]}"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; True when written."""
    data = text.encode()
    if path.is_file() and path.read_bytes() == data:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created when missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def file_locks(paths: Sequence[Path]) -> Iterator[None]:
    """Hold the locks of all ``paths``, taken in sorted order so two builders never deadlock."""
    with contextlib.ExitStack() as stack:
        for path in sorted(set(paths)):
            stack.enter_context(file_lock(path))
        yield
