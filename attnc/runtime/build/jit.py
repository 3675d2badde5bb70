"""JIT building and loading of torch-free CUDA modules.

``build_module``/``build_modules`` turn CUDA source text into shared libraries in the cache
(see ``cache.py``), running nvcc through ninja (several modules in parallel); ``load_library``
opens each library once with ctypes. Set ``ATTNC_VERBOSE=1`` to see commands and cache paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnc.runtime.build import cache, ninja_build, toolchain

PROGRESS_AFTER_S = 1.0
_LIBRARIES: dict[str, ctypes.CDLL] = {}
_LIBRARIES_LOCK = threading.Lock()


class BuildError(RuntimeError):
    """nvcc failed; the message holds the generated file, the exact command and the output."""


@dataclass(frozen=True)
class ModuleSpec:
    """One module to build: a readable ``name`` and its CUDA ``source`` text."""

    name: str
    source: str
    extra_flags: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class _Plan:
    """Everything known about one module before it is built."""

    spec: ModuleSpec
    directory: Path
    source: Path
    library: Path
    build_file: Path
    stamp: Path
    lock: Path
    command: list[str]


def verbose() -> bool:
    """True when ``ATTNC_VERBOSE`` asks for commands and cache paths on stderr."""
    return os.environ.get("ATTNC_VERBOSE", "") not in ("", "0")


def _plan(spec: ModuleSpec, arch: str, nvcc: str, headers: str) -> _Plan:
    flags = toolchain.nvcc_flags(arch, (str(cache.INCLUDE_DIR),), spec.extra_flags)
    key = cache.cache_key(spec.name, spec.source, flags, arch, headers)
    directory = cache.cache_dir() / key
    name = cache.safe_name(spec.name)
    source, library = directory / f"{name}.cu", directory / f"{name}.so"
    return _Plan(
        spec=spec,
        directory=directory,
        source=source,
        library=library,
        build_file=directory / "build.ninja",
        stamp=directory / "built.ok",
        lock=directory.with_name(f"{key}.lock"),
        command=ninja_build.nvcc_command(
            nvcc, [*flags, *toolchain.speed_flags(nvcc)], source, library
        ),
    )


def _is_built(plan: _Plan) -> bool:
    return plan.stamp.is_file() and plan.library.is_file()


def _write_files(plan: _Plan) -> None:
    plan.directory.mkdir(parents=True, exist_ok=True)
    cache.write_if_changed(plan.source, plan.spec.source)
    nvcc, flags = plan.command[0], plan.command[1:-3]
    text = ninja_build.render_build_file(nvcc, flags, plan.source, plan.library)
    cache.write_if_changed(plan.build_file, text)


def _build_error(failed: Sequence[_Plan], output: str) -> BuildError:
    parts = ["attnc: nvcc failed"]
    for plan in failed:
        parts.append(f"  generated file: {plan.source}")
        parts.append(f"  command: {shlex.join(plan.command)}")
    parts.append("compiler output:")
    parts.append(output.rstrip())
    return BuildError("\n".join(parts))


def _run_build(plans: Sequence[_Plan], jobs: int | None) -> None:
    ninja = toolchain.find_ninja()
    if len(plans) == 1:
        build_file = plans[0].build_file
    else:
        digest = hashlib.sha256("\n".join(str(p.build_file) for p in plans).encode())
        group = cache.cache_dir() / f"group_{digest.hexdigest()[:16]}.ninja"
        build_file = ninja_build.write_group_file(group, [p.build_file for p in plans])
    if verbose():
        for plan in plans:
            print(f"attnc: {shlex.join(plan.command)}", file=sys.stderr)
    rc, output = ninja_build.run_ninja(ninja, build_file, [p.library for p in plans], jobs)
    failed = [p for p in plans if rc != 0 and not _newer(p.library, p.source)]
    for plan in plans:
        if plan not in failed:
            cache.write_if_changed(plan.stamp, shlex.join(plan.command) + "\n")
    if rc != 0:
        raise _build_error(failed or plans, output)


def _newer(target: Path, source: Path) -> bool:
    return target.is_file() and target.stat().st_mtime >= source.stat().st_mtime


def build_modules(
    specs: Sequence[ModuleSpec], *, arch: str | None = None, jobs: int | None = None
) -> list[Path]:
    """Build every module in ``specs`` (cache hits are free) and return their library paths.

    ``arch`` is e.g. ``"80"`` or ``"sm_90a"``; by default the current CUDA device's arch.
    Missing modules are compiled together in one ninja run.
    """
    arch = toolchain.normalize_arch(arch) if arch is not None else toolchain.current_arch()
    nvcc, headers = toolchain.find_nvcc(), cache.header_digest()
    plans = [_plan(s, arch, nvcc, headers) for s in specs]
    if verbose():
        for plan in plans:
            print(f"attnc: module {plan.spec.name}: {plan.directory}", file=sys.stderr)
    missing = [p for p in plans if not _is_built(p)]
    if missing:
        with cache.file_locks([p.lock for p in missing]):
            missing = [p for p in missing if not _is_built(p)]  # another process may have built
            if missing:
                _build_with_progress(missing, jobs)
    return [p.library for p in plans]


def _build_with_progress(plans: Sequence[_Plan], jobs: int | None) -> None:
    for plan in plans:
        _write_files(plan)
        plan.stamp.unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        _run_build(plans, jobs)
    finally:
        elapsed = time.perf_counter() - start
        if elapsed > PROGRESS_AFTER_S or verbose():
            names = ", ".join(p.spec.name for p in plans)
            print(f"attnc: building {names} (nvcc) ... {elapsed:.1f} s", file=sys.stderr)


def build_module(
    name: str, source: str, *, arch: str | None = None, extra_flags: Sequence[str] = ()
) -> Path:
    """Build one module from CUDA ``source`` (or find it in the cache); return the .so path."""
    return build_modules([ModuleSpec(name, source, tuple(extra_flags))], arch=arch)[0]


def load_library(path: Path | str) -> ctypes.CDLL:
    """Open the shared library at ``path`` with ctypes, once per path."""
    key = str(Path(path).resolve())
    with _LIBRARIES_LOCK:
        lib = _LIBRARIES.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            _LIBRARIES[key] = lib
        return lib
