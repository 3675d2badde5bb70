"""Owns: building and loading a host-only C++ library of ``attnc/kernels/host`` (the decode
and prefill planners): its source text under a digest of the host headers (so any header
change rebuilds it), the JIT build, the ctypes signatures, the check that the library's
``sizeof`` of each struct equals its ctypes mirror, and the load-once state (a lasting
failure, no nvcc or nvcc's error say, is remembered and raised again on every call with no
second build attempt; a passing one, a lock timeout or an interrupted build, is not)."""

from __future__ import annotations

import ctypes
import os
import re
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnc.runtime.build import cache, jit


def host_source(host_dir: Path, file_name: str) -> str:
    """The text the JIT compiles: ``file_name`` under a digest of ``host_dir``'s headers."""
    digest = cache.header_digest(host_dir)
    text = (host_dir / file_name).read_text()
    return f"// attnc/kernels/host headers: {digest}\n{text}"


def load_host_library(
    name: str,
    source: str,
    arch: str,
    flags: Sequence[str],
    signatures: Mapping[str, tuple[Any, Any]],
    structs: Sequence[type[ctypes.Structure]],
    sizes_function: str,
) -> ctypes.CDLL:
    """Build (or find in the cache) and load library ``name``, set its functions'
    signatures, and compare its struct sizes (``sizes_function`` writes them as int64, in
    ``structs`` order) with the ctypes mirrors."""
    path = jit.build_module(name, source, arch=arch, extra_flags=tuple(flags))
    lib = jit.load_library(path)
    for fn_name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, fn_name)
        fn.argtypes, fn.restype = argtypes, restype
    sizes = np.zeros(len(structs), np.int64)
    getattr(lib, sizes_function)(sizes.ctypes.data)
    want = [ctypes.sizeof(s) for s in structs]
    if sizes.tolist() != want:
        raise RuntimeError(f"struct sizes {sizes.tolist()} differ from the ctypes mirrors {want}")
    return lib


class PlannerUnavailable(RuntimeError):
    """A host planner library could not be built or loaded (the message says why)."""


# The line of a build error that says its nvcc did not finish: killed by a signal, or stopped.
_INTERRUPTED = re.compile(r"^(\(exit status -\d+\)|stopped \(the build was interrupted\))$", re.M)


def passing(exc: Exception) -> bool:
    """True when ``exc``, a failed build or load, may not happen on the next try: a build
    lock held by another process past the timeout (``cache.LockTimeout``), an nvcc killed by
    a signal (an interrupted build), a library refused at load (``jit.LibraryRefused``: it
    is rebuilt on next use) or an OS error (a full disk, say; the dynamic loader's refusal
    of a library is a lasting ``jit.BuildError``)."""
    if isinstance(exc, (cache.LockTimeout, jit.LibraryRefused, OSError)):
        return True
    return isinstance(exc, jit.BuildError) and _INTERRUPTED.search(str(exc)) is not None


class OnceLibrary:
    """A library loaded by ``load()`` on first use. A lasting failure (not ``passing``: no
    nvcc, nvcc's error on the source, struct sizes that differ) is remembered: every later
    ``get()`` raises ``unavailable(reason)`` without trying again. A passing one is raised
    once, and the next ``get()`` tries again. A child forked while another thread loads the
    library finds it unloaded, and loads it itself."""

    def __init__(
        self, load: Callable[[], ctypes.CDLL], unavailable: Callable[[str], Exception]
    ) -> None:
        self._load = load
        self._unavailable = unavailable
        self._lock = threading.Lock()
        self.lib: ctypes.CDLL | None = None
        self.failure: str | None = None
        self._background_failure: Exception | None = None  # a passing one, for the next get()
        _ONCE_LIBRARIES.add(self)

    def get(self) -> ctypes.CDLL:
        """The loaded library (built on the first call, or on the call after a passing
        failure; a passing failure of the background load is raised by the next call, which
        waited for it, without a second try). Every raise's message holds the failure's
        words (nvcc's command and output); the first raise after a load attempt also keeps
        that attempt's error as its ``__context__``, not displayed (the message says it
        already); the error's frames are cleared, so it keeps no caller's locals."""
        with self._lock:
            cause, self._background_failure = self._background_failure, None
            reason = self.failure or _described(cause)
            if self.lib is None and reason is None:
                cause = self._try_load()
                reason = _described(cause)
            if self.lib is None:
                if cause is None:  # a remembered failure: nothing of this call's to keep
                    raise self._unavailable(str(reason))
                error = self._unavailable(str(reason))
                # This call's own failure: not chained as the cause (a traceback printed its
                # words twice, nvcc's output with them), kept as the context for ``except``
                # (a LockTimeout), set after the raise, which sets it to any exception the
                # caller is handling.
                try:
                    raise error from None
                finally:
                    error.__context__ = cause
                    del cause, error  # no cycle: cause -> traceback -> frames -> this frame
            return self.lib

    def _try_load(self) -> Exception | None:
        """Load the library into ``lib``; the failure (its words remembered in ``failure``
        when it lasts), or None."""
        try:
            self.lib = self._load()
        except Exception as exc:  # no compiler, a build or load failure
            traceback.clear_frames(exc.__traceback__)  # keep its lines, not the frames' locals
            if not passing(exc):
                self.failure = _described(exc)
            return exc
        return None

    def _after_fork_in_child(self) -> None:
        """The lock freed: the thread that held it in the parent does not run here."""
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        """True once loaded, or once failed for good: nothing is left to build."""
        return self.lib is not None or self.failure is not None

    def load_in_background(self, name: str) -> threading.Thread:
        """Start the load on a thread named ``name`` and return it, so that the caller can
        build something else meanwhile; its failure is raised by the next ``get()`` (a
        lasting one by every later call, a passing one once: the call after it tries
        again)."""

        def load() -> None:
            with self._lock:
                if self.lib is None and self.failure is None:
                    # the next get() raises it (a passing one by that call only)
                    self._background_failure = self._try_load()

        thread = threading.Thread(target=load, name=name, daemon=True)
        thread.start()
        return thread


_ONCE_LIBRARIES: weakref.WeakSet[OnceLibrary] = weakref.WeakSet()


def _described(exc: Exception | None) -> str | None:
    """How ``PlannerUnavailable`` words a failure: its type and message."""
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def _after_fork_in_child() -> None:
    for once in list(_ONCE_LIBRARIES):
        once._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
