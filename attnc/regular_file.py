"""Owns: reading a file whose path may hold anything (a cache entry, a build record, a
source): a pipe is never waited on, a device never read, and no more than a limit is read;
and writing a file through a temporary file renamed over it, with the mode ``open()`` would
give (a cache's own file name taken by a directory is cleared first where asked)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_regular(path: str | Path, limit: int, what: str | None = None) -> bytes:
    """At most ``limit + 1`` bytes of the regular file at ``path`` (a caller compares the
    length with ``limit``). Anything else at ``path`` is an ``OSError`` naming it before a
    byte is read: ``FileNotFoundError``, ``IsADirectoryError``, or ``EINVAL`` for a pipe, a
    socket or a device, with ``what`` saying what the path should be. The path is opened
    without waiting (a pipe with no writer would block ``open``) and checked on the open
    file, so nothing can be swapped in between."""
    return read_regular_file(path, limit, what)[0]


def read_regular_file(
    path: str | Path, limit: int, what: str | None = None
) -> tuple[bytes, os.stat_result]:
    """:func:`read_regular`, with the status of the file read (what a caller compares to
    decide whether the bytes came from the file a name stands for)."""
    fd = os.open(path, _FLAGS)
    try:
        status = os.fstat(fd)
        mode = status.st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            why = "not a regular file" + (f" ({what})" if what else "")
            raise OSError(errno.EINVAL, why, str(path))
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), status
    finally:
        os.close(fd)


def write_atomically(
    path: str | Path, data: bytes, prefix: str, replace_directory: bool = False
) -> None:
    """``data`` written to ``path`` through a new temporary file beside it (``prefix``, a
    random part, ``.tmp``; see :func:`temporary_file` for its mode) renamed over it: a reader
    sees the old file or the new one, never part of one, and writers at once (threads or
    processes) never share a temporary file. On any failure the temporary file is removed
    and the error raised as it came: wording it is the caller's. ``replace_directory``: a
    directory (not a link) at ``path`` is removed first: for a cache's own entry names,
    where it can only be damage (a rename cannot replace it, so the entry was never
    written again)."""
    if replace_directory and os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    fd, tmp = temporary_file(os.path.dirname(path) or ".", prefix, ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temporary_file(directory: str | Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``directory``, with the mode ``open()`` would give a new file
    (0666 less the umask) rather than mkstemp's 0600: a cache or output written by one user
    (a deployment's build) stays readable by another (its server) as the umask allows."""
    fd, path = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    with contextlib.suppress(OSError):  # a file system without modes (vfat, some mounts)
        os.fchmod(fd, 0o666 & ~_umask())
    return fd, path


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it
    (``/proc/self/status``): setting it to read it would give another thread's new files a
    mode of 0666 for a moment."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # two threads at once would read and restore each other's value
        mask = os.umask(0o077)  # the narrowest mode for the moment it is set
        os.umask(mask)
    return mask


_UMASK_LOCK = threading.Lock()
