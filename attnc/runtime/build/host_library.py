"""Owns: building and loading a host-only C++ library of ``attnc/kernels/host`` (the decode
and prefill planners): its source text under a digest of the host headers (so any header
change rebuilds it), the JIT build, the ctypes signatures, the check that the library's
``sizeof`` of each struct equals its ctypes mirror, and the load-once state (a failure is
remembered and raised again on every call, with no second build attempt)."""

from __future__ import annotations

import ctypes
import threading
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


class OnceLibrary:
    """A library loaded by ``load()`` on first use. A failure is remembered: every later
    ``get()`` raises ``unavailable(reason)`` without trying again."""

    def __init__(
        self, load: Callable[[], ctypes.CDLL], unavailable: Callable[[str], Exception]
    ) -> None:
        self._load = load
        self._unavailable = unavailable
        self._lock = threading.Lock()
        self.lib: ctypes.CDLL | None = None
        self.failure: str | None = None

    def get(self) -> ctypes.CDLL:
        """The loaded library (built on the first call)."""
        with self._lock:
            if self.lib is None and self.failure is None:
                try:
                    self.lib = self._load()
                except Exception as exc:  # no compiler, a build or load failure
                    self.failure = f"{type(exc).__name__}: {exc}"
            if self.lib is None:
                raise self._unavailable(str(self.failure))
            return self.lib

    @property
    def settled(self) -> bool:
        """True once loaded, or once failed: nothing is left to build."""
        return self.lib is not None or self.failure is not None

    def load_in_background(self, name: str) -> threading.Thread:
        """Start ``get()`` on a thread named ``name`` and return it, so that the caller can
        build something else meanwhile; a failure is kept and raised by the next ``get()``."""

        def load() -> None:
            try:
                self.get()
            except Exception:  # kept in self.failure: get() raises it again
                pass

        thread = threading.Thread(target=load, name=name, daemon=True)
        thread.start()
        return thread
