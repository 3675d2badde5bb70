"""Owns: reading a file whose path may hold anything (a cache entry, a build record, a
source): a pipe is never waited on, a device never read, and no more than a limit is read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_regular(path: str | Path, limit: int, what: str | None = None) -> bytes:
    """At most ``limit + 1`` bytes of the regular file at ``path`` (a caller compares the
    length with ``limit``). Anything else at ``path`` is an ``OSError`` naming it before a
    byte is read: ``FileNotFoundError``, ``IsADirectoryError``, or ``EINVAL`` for a pipe, a
    socket or a device, with ``what`` saying what the path should be. The path is opened
    without waiting (a pipe with no writer would block ``open``) and checked on the open
    file, so nothing can be swapped in between."""
    fd = os.open(path, _FLAGS)
    try:
        mode = os.fstat(fd).st_mode
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
        return b"".join(chunks)
    finally:
        os.close(fd)
