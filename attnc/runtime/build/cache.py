"""The on-disk build cache: where modules live, how they are keyed, and how they are written.

A module's directory is ``<cache dir>/<readable name>_<hash prefix>``; the hash covers
everything that changes the binary. Files are rewritten only when their content changes, and
builds of one key are serialised by an ``fcntl`` lock on a file next to the directory. The
holder writes its pid, host and start time into the lock file; a waiter prints them and gives
up after ``$ATTNC_LOCK_TIMEOUT`` seconds (default 900; ``inf`` waits forever).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from attnc.cache_root import cache_dir
from attnc.dsl.errors import printable
from attnc.regular_file import write_atomically
from attnc.version import PACKAGE_DIR, __version__

INCLUDE_DIR = PACKAGE_DIR / "kernels" / "include"


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _not_writable(path: Path, exc: OSError) -> OSError:
    """``exc`` (a write to ``path`` refused) as the same kind of error, naming the cache root
    and the variable that moves it."""
    return type(exc)(
        f"cannot write {printable(str(path))}: {exc.strerror}; the cache root "
        f"{printable(str(cache_dir()))} must be writable to build a module that is not in it "
        "(set ATTNC_CACHE_DIR, or attnc build's -o, to a writable directory)"
    )


def make_dir(directory: Path) -> None:
    """``directory`` and its parents, created where missing; an error naming the cache root
    when a part of the path is a file, a dangling symbolic link or one that loops
    (``ATTNC_CACHE_DIR`` set to one, say), or cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _NOT_WRITABLE:
            raise _not_writable(directory, exc) from None
        if not isinstance(exc, (FileExistsError, NotADirectoryError)) and exc.errno != errno.ELOOP:
            raise
        raise NotADirectoryError(
            f"cannot make the directory {printable(str(directory))}: part of its path is a "
            f"file, a symbolic link to nothing or a symbolic link that loops (the cache root is "
            f"{printable(str(cache_dir()))}; ATTNC_CACHE_DIR sets it)"
        ) from None


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
    """Readable name plus the first 16 hex digits of the hash of every build input (the
    flags as a JSON list: no two lists of flags share a text)."""
    h = hashlib.sha256()
    for part in (source, headers, json.dumps(list(flags)), arch, __version__):
        h.update(part.encode())
        h.update(b"\0")
    return f"{safe_name(name)}_{h.hexdigest()[:16]}"


_SHELL_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+,=@%:~-]")  # one plain ASCII character


def shell_safe(path: Path | str) -> bool:
    """True when ``path`` holds no character a shell would treat specially inside double
    quotes, where nvcc puts the paths it hands its sub-tools: ASCII letters, digits and
    punctuation that is plain there, spaces, and printable non-ASCII text (``$``, backquotes,
    quotes, backslashes, ``!`` and control characters are not safe)."""
    return all(
        c == " " or (c.isprintable() and (ord(c) > 127 or _SHELL_SAFE_PATH.fullmatch(c)))
        for c in str(path)
    )


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; True when written (a
    directory in its place is removed first: ``remove_file``). Text is written as UTF-8, with
    the undecodable bytes of a path (held as surrogates, see ``os.fsdecode``) written back as
    they were."""
    data = text.encode("utf-8", "surrogateescape")
    if path.is_file() and path.read_bytes() == data:
        return False
    if path.is_dir():  # a damaged entry (the cache writes only files here): os.replace fails
        remove_file(path)
    try:
        write_atomically(path, data, f".{path.name}.")  # no temporary file left on failure
    except OSError as exc:  # a full disk, say
        raise _write_failed(path, exc) from exc
    return True


def _write_failed(path: Path, exc: OSError) -> OSError:
    """``exc`` (writing ``path`` failed) as the same kind of error, naming the file."""
    if exc.errno in _NOT_WRITABLE:
        return _not_writable(path, exc)
    return type(exc)(exc.errno, f"cannot write {printable(str(path))}: {exc.strerror}")


def remove_file(path: Path) -> None:
    """``path`` removed when there, a directory in its place too (a damaged entry: the cache
    writes only files there); an error naming it and the cache root when it cannot be."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise type(exc)(
            f"cannot remove {printable(str(path))} (a damaged cache entry): {exc.strerror or exc}; "
            f"remove it by hand (the cache root is {printable(str(cache_dir()))}; "
            "ATTNC_CACHE_DIR sets it)"
        ) from None


DEFAULT_LOCK_TIMEOUT_S = 900.0
LOCK_NOTICE_EVERY_S = 30.0


class LockTimeout(RuntimeError):
    """A build lock stayed held by another process for longer than the lock timeout."""


def lock_timeout() -> float:
    """Seconds to wait for a build lock: ``$ATTNC_LOCK_TIMEOUT`` (``inf`` waits forever)."""
    text = os.environ.get("ATTNC_LOCK_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also rejects nan
        raise ValueError(
            f"ATTNC_LOCK_TIMEOUT must be a number of seconds >= 0 or 'inf', got {text!r}"
        )
    return value


def _holder(fh: object) -> str:
    """Who holds the lock, as its holder wrote it (best effort; control characters
    escaped)."""
    try:  # read through the open lock, never by its name again
        raw = os.pread(fh.fileno(), 400, 0)  # type: ignore[attr-defined]
    except OSError:
        raw = b""
    text = raw.decode("utf-8", errors="replace").strip()
    return printable(text) if text else "an unknown process"


def _stamp_holder(fd: int) -> None:
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {since}\n".encode())


def _acquire(fh: object, path: Path, deadline: float) -> bool:
    """Lock ``fh`` (the file opened at ``path``), waiting until ``deadline``: True when held,
    False when the file is no longer the one at ``path`` (deleted or replaced while this
    process opened or waited for it: another process may lock the new file, so the caller
    opens the path again)."""
    fd = fh.fileno()  # type: ignore[attr-defined]
    next_notice = time.monotonic()
    delay = 0.02
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _still_at(fd, path):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            _stamp_holder(fd)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise LockTimeout(
                f"attnc: gave up waiting for the build lock {printable(str(path))}, "
                f"held by {_holder(fh)}, "
                f"after {lock_timeout():g} s (ATTNC_LOCK_TIMEOUT); if that build is hung, "
                "stop it (or delete the lock file once it is gone) and retry"
            )
        if now >= next_notice:
            print(
                f"attnc: waiting for the build lock {printable(str(path))}, held by {_holder(fh)}",
                file=sys.stderr,
            )
            next_notice = now + LOCK_NOTICE_EVERY_S
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, 0.5)


def _still_at(fd: int, path: Path) -> bool:
    """True when the open file ``fd`` is the file now at ``path``."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


# The descriptors of the build locks this process holds. The build commands inherit them
# (``inherited_lock_fds``): a lock is on the open file, so it lasts while any of them runs,
# even when this process is killed, and no other builder writes beside an orphaned nvcc.
_HELD_LOCK_FDS: set[int] = set()
_HELD_LOCK_FDS_GUARD = threading.Lock()  # no descriptor closed while a command starts


def _after_fork_in_child() -> None:
    """A forked child holds none of its parent's build locks (the threads that took them do
    not run here), and starts with the guard free."""
    global _HELD_LOCK_FDS_GUARD
    _HELD_LOCK_FDS_GUARD = threading.Lock()
    _HELD_LOCK_FDS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def inherited_lock_fds() -> Iterator[tuple[int, ...]]:
    """The descriptors of the build locks held now, kept open for the block: start the
    build command that inherits them inside it."""
    with _HELD_LOCK_FDS_GUARD:
        yield tuple(sorted(_HELD_LOCK_FDS))


_LOCK_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK


def _open_lock(path: Path) -> BinaryIO:
    """The lock file at ``path``, opened for appending (created when missing); an error
    naming it and the cache root when it is a directory, a symbolic link or anything but a
    regular file (the holder's stamp truncates it: a link would have it write elsewhere), or
    cannot be written."""
    try:
        fd = os.open(path, _LOCK_OPEN_FLAGS, 0o644)
    except OSError as exc:
        if exc.errno in _NOT_WRITABLE:
            raise _not_writable(path, exc) from None
        if exc.errno == errno.ELOOP:
            raise OSError(_not_a_lock_file(path, "a symbolic link, not a file")) from None
        if not isinstance(exc, IsADirectoryError):
            raise
        raise IsADirectoryError(_not_a_lock_file(path, "a directory, not a file")) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(_not_a_lock_file(path, "not a regular file"))
    return os.fdopen(fd, "a+b")


def _not_a_lock_file(path: Path, what: str) -> str:
    return (
        f"cannot use {printable(str(path))} as a build lock: it is {what}; remove "
        f"it (the cache root is {printable(str(cache_dir()))}; ATTNC_CACHE_DIR sets it)"
    )


@contextlib.contextmanager
def file_lock(path: Path, deadline: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created when missing) for the block.

    Waits until ``deadline`` (a ``time.monotonic()`` value; by default now plus
    :func:`lock_timeout`), telling stderr who holds it, then raises :class:`LockTimeout`.
    """
    if deadline is None:
        deadline = time.monotonic() + lock_timeout()
    make_dir(path.parent)
    while True:
        with _open_lock(path) as fh:
            if not _acquire(fh, path, deadline):
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"attnc: the build lock {printable(str(path))} was deleted or replaced "
                        f"each time it was taken, for {lock_timeout():g} s (ATTNC_LOCK_TIMEOUT)"
                    )
                make_dir(path.parent)  # the cache was cleared meanwhile, say
                time.sleep(0.02)  # no busy loop where the file keeps changing
                continue
            with _HELD_LOCK_FDS_GUARD:
                _HELD_LOCK_FDS.add(fh.fileno())
            try:
                yield
            finally:
                with _HELD_LOCK_FDS_GUARD:
                    _HELD_LOCK_FDS.discard(fh.fileno())
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            return


@contextlib.contextmanager
def file_locks(paths: Sequence[Path]) -> Iterator[None]:
    """Hold the locks of all ``paths``, taken in sorted order so two builders never deadlock
    (one deadline for all of them)."""
    timeout = lock_timeout()
    deadline = math.inf if math.isinf(timeout) else time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        for path in sorted(set(paths)):
            stack.enter_context(file_lock(path, deadline))
        yield
