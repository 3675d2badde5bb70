"""JIT building and loading of torch-free CUDA modules.

``build_module``/``build_modules`` turn CUDA source text into shared libraries in the cache
(see ``cache.py``), running nvcc without a shell (several modules in parallel, and the sources
of a module of several in parallel, see ``nvcc_run.py``). nvcc writes a
``.partial`` file that is checked (a whole ELF file) and renamed into place; its size and
sha256 go into the build record, and a library that no longer matches its record is rebuilt
(see ``artifact.py``). ``load_library`` opens each library once with ctypes, after the same
check; a library found without its record (a rebuild in another process removes the record
first) is checked and opened under the module's build lock, once that build is done. Set
``ATTNC_VERBOSE=1`` to see commands and cache paths.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import hashlib
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnc.dsl.errors import printable
from attnc.runtime.build import artifact, cache, ninja_build, nvcc_run, toolchain
from attnc.verbose import verbose

PROGRESS_AFTER_S = 1.0
Progress = Callable[[str], None]
_LIBRARIES: dict[str, ctypes.CDLL] = {}
_LIBRARIES_LOCK = threading.Lock()


class BuildError(RuntimeError):
    """nvcc failed; the message holds the generated file, the exact command and the output."""


class LibraryRefused(BuildError):
    """A library was not loaded: damaged, or without its build record (it is rebuilt on
    next use)."""


@dataclass(frozen=True)
class ModuleSpec:
    """One module to build: a readable ``name`` and its CUDA ``source`` text; ``parts``, the
    text of further translation units compiled in parallel with ``source`` and linked into
    the same library (hidden symbols of one resolve in another)."""

    name: str
    source: str
    extra_flags: tuple[str, ...] = field(default=())
    parts: tuple[str, ...] = field(default=())

    def texts(self) -> tuple[str, ...]:
        """``source``, then ``parts``."""
        return (self.source, *self.parts)


@dataclass(frozen=True)
class _Plan:
    """Everything known about one module before it is built."""

    spec: ModuleSpec
    directory: Path
    sources: tuple[Path, ...]  # NAME.cu, then NAME.part1.cu, ... for spec.parts
    library: Path
    partial: Path
    build_file: Path
    stamp: Path
    lock: Path
    flags: tuple[str, ...]
    nvcc: str = ""  # found only when the module must be built (a cache hit needs no nvcc)

    def with_nvcc(self, nvcc: str, jobs: int | None = None) -> _Plan:
        """This plan, built by ``nvcc`` (with the flags that only make it faster, within
        ``jobs`` nvcc processes' share of the CPUs when given)."""
        return dataclasses.replace(
            self, nvcc=nvcc, flags=(*self.flags, *toolchain.speed_flags(nvcc, jobs))
        )

    @property
    def source(self) -> Path:
        """The main source file."""
        return self.sources[0]

    def steps(self, where: Path | None = None, output: Path | None = None) -> nvcc_run.Steps:
        """The nvcc commands, with the sources in ``where`` (default: the module directory),
        writing ``output`` (default: the partial file)."""
        folder = where or self.directory
        sources = [folder / s.name for s in self.sources]
        return nvcc_run.steps(self.nvcc, self.flags, sources, output or folder / self.partial.name)


def _commands_text(commands: Sequence[Sequence[str]]) -> str:
    return " && ".join(shlex.join(c) for c in commands)


def _plan(spec: ModuleSpec, arch: str, headers: str) -> _Plan:
    flags = toolchain.nvcc_flags(arch, (str(cache.INCLUDE_DIR),), spec.extra_flags)
    key_text = "\x1e".join(spec.texts())  # a module of one source keeps its key
    key_flags = [*flags, *toolchain.environment_flags()]
    key = cache.cache_key(spec.name, key_text, key_flags, arch, headers)
    directory = cache.cache_dir() / key
    name = cache.safe_name(spec.name)
    sources = [directory / f"{name}.cu"]
    sources += [directory / f"{name}.part{i}.cu" for i in range(1, len(spec.parts) + 1)]
    return _Plan(
        spec=spec,
        directory=directory,
        sources=tuple(sources),
        library=directory / f"{name}.so",
        partial=directory / f"{name}.so.partial",
        build_file=directory / "build.ninja",
        stamp=directory / "built.ok",
        lock=build_lock(directory),
        flags=tuple(flags),
    )


def build_lock(directory: Path) -> Path:
    """The lock file that serialises the builds of the module in ``directory``."""
    return directory.with_name(f"{directory.name}.lock")


def _is_built(plan: _Plan, quiet: bool = False) -> bool:
    """True when the library is there and sound (a ``built.ok`` that is not a readable file
    is a damaged record), built by the installed nvcc where there is one."""
    if not (os.path.lexists(plan.stamp) and plan.library.is_file()):
        return False
    nvcc = toolchain.installed_release()
    problem = artifact.library_problem(plan.library, plan.stamp, plan.directory.name, nvcc)
    if problem is not None and not quiet:
        print(f"attnc: rebuilding {printable(str(plan.library))}: {problem}", file=sys.stderr)
    return problem is None


def _write_files(plan: _Plan) -> None:
    cache.make_dir(plan.directory)
    for path, text in zip(plan.sources, plan.spec.texts(), strict=True):
        cache.write_if_changed(path, text)
    # Named relative to the module directory (``ninja -C DIR``): the cache path, which may
    # hold characters a ninja file cannot spell (a newline, ``|``), never appears in it.
    by_hand = plan.steps(where=Path(), output=Path(plan.library.name)).all()
    cache.write_if_changed(plan.build_file, ninja_build.render_build_file(by_hand))


def _build_error(failed: Sequence[tuple[_Plan, nvcc_run.Outcome]]) -> BuildError:
    parts = ["attnc: nvcc failed"]
    for plan, outcome in failed:
        failing = Path(outcome.command[-1])  # the source of a failed compile, else an object
        shown = plan.directory / failing.name if failing.suffix == ".cu" else plan.source
        parts.append(f"  generated file: {printable(str(shown))}")
        parts.append(f"  command: {printable(_commands_text(outcome.commands_to_repeat()))}")
        if failing.parent != plan.directory:
            parts.append(
                f"  (nvcc ran in the temporary copy {printable(str(failing.parent))}, kept for "
                "repeating the command: nvcc's shell would expand the cache path)"
            )
    parts.append("compiler output:")
    for _, outcome in failed:
        parts.extend(printable(line) for line in outcome.output.rstrip().splitlines())
        parts.append(printable(str(outcome.failure)))
    return BuildError("\n".join(parts))


def staging_root() -> str:
    """A temporary directory whose path nvcc's shell leaves as it is (``TMPDIR``, else
    ``/tmp``): where builds whose own directory needs quoting are staged."""
    for root in (tempfile.gettempdir(), "/tmp"):
        if cache.shell_safe(root) and os.path.isdir(root):
            return root
    raise BuildError("attnc: no temporary directory whose path nvcc can use (set TMPDIR)")


def _fresh_staging(directory: Path) -> Path:
    """A new temporary directory for the module built into ``directory``, named by a digest
    of that path; the copies of this module's earlier failed builds are removed first (its
    build lock is held: no other build into ``directory`` runs; a build of the same module
    into another cache has another digest), so repeated failures keep one."""
    digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:16]
    prefix = f"attnc-build-{digest}-"
    root = staging_root()
    for old in Path(root).glob(f"{prefix}*"):
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def nvcc_env() -> dict[str, str] | None:
    """The environment for nvcc: unchanged, unless ``TMPDIR`` (where nvcc writes its
    intermediate files, named on its sub-tools' shell command lines) needs quoting."""
    tmpdir = os.environ.get("TMPDIR")
    if tmpdir is None or cache.shell_safe(tmpdir):
        return None
    return {**os.environ, "TMPDIR": staging_root()}


def _compile(plan: _Plan, kept: list[Path], running: nvcc_run.Running) -> nvcc_run.Outcome:
    """Run nvcc (no shell) into the partial file, check it, and rename it into place.

    nvcc passes the source's absolute path to its sub-tools through a shell, so a module
    directory whose path a shell would expand is built in a temporary directory instead. A
    directory in place of the partial file or the library (a damaged entry) is removed
    (``cache.remove_file``). A temporary directory kept after a failure is added to ``kept``."""
    cache.remove_file(plan.partial)
    staging = None
    if not cache.shell_safe(plan.directory):
        staging = _fresh_staging(plan.directory)
        for source in plan.sources:
            shutil.copyfile(source, staging / source.name)
    build = plan.steps(staging)
    outcome = None
    try:
        outcome = nvcc_run.run_steps(build, staging or plan.directory, nvcc_env(), running)
        if staging is not None and outcome.failure is None:
            shutil.copyfile(staging / plan.partial.name, plan.partial)
    finally:
        if staging is not None and (outcome is None or outcome.failure is None):
            shutil.rmtree(staging, ignore_errors=True)
        elif staging is not None:
            kept.append(staging)  # for repeating the command: see _build_error
    if outcome.failure is not None:
        cache.remove_file(plan.partial)
        return outcome
    problem = artifact.elf_problem(plan.partial)
    if problem is not None:
        cache.remove_file(plan.partial)  # a directory or pipe nvcc left there too
        failure = f"nvcc exited 0 but its output is {problem}"
        return nvcc_run.Outcome(outcome.command, outcome.output, failure)
    version = toolchain.nvcc_version(plan.nvcc)
    release = version.release if version is not None else None
    key = plan.directory.name
    record = artifact.record_text(plan.partial, _commands_text(build.all()), key, release)
    if plan.library.is_dir():
        cache.remove_file(plan.library)
    os.replace(plan.partial, plan.library)
    cache.write_if_changed(plan.stamp, record)
    artifact.mark_sound(plan.library, plan.stamp, key, release)
    return outcome


def _run_build(plans: Sequence[_Plan], jobs: int | None, progress: Progress | None) -> None:
    if not cache.shell_safe(cache.INCLUDE_DIR):
        raise BuildError(
            f"attnc: the kernel headers' path {printable(str(cache.INCLUDE_DIR))} "
            "holds characters the shell "
            "inside nvcc would expand; install attnc under a plain path"
        )
    if verbose():
        for plan in plans:
            print(f"attnc: {printable(_commands_text(plan.steps().all()))}", file=sys.stderr)
    workers = max(1, min(len(plans), jobs or os.cpu_count() or 1))

    kept: list[Path] = []  # temporary copies of failed builds, named by the error
    running = nvcc_run.Running(jobs)  # jobs bounds nvcc runs, a module of two sources has two

    def compile_and_report(plan: _Plan) -> nvcc_run.Outcome:
        start = time.perf_counter()
        outcome = _compile(plan, kept, running)
        if progress is not None:
            state = "built" if outcome.failure is None else "FAILED"
            progress(f"{plan.spec.name}: {state} in {time.perf_counter() - start:.1f} s")
        return outcome

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    try:
        outcomes = list(pool.map(compile_and_report, plans))
    except BaseException:  # Ctrl-C reaches this thread only: nvcc stops before the locks go
        pool.shutdown(wait=False, cancel_futures=True)
        running.stop()
        pool.shutdown(wait=True)
        for staging in kept:  # no error will name the copies
            shutil.rmtree(staging, ignore_errors=True)
        raise
    pool.shutdown(wait=True)
    failed = [(p, o) for p, o in zip(plans, outcomes, strict=True) if o.failure is not None]
    if failed:
        raise _build_error(failed)


def build_modules(
    specs: Sequence[ModuleSpec],
    *,
    arch: str | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> list[Path]:
    """Build every module in ``specs`` (cache hits are free) and return their library paths.

    ``arch`` is e.g. ``"80"`` or ``"sm_90a"``; by default the current CUDA device's arch.
    Missing modules are compiled in parallel (``jobs`` nvcc processes at most);
    ``progress``, when given, is called with one line per module as it finishes.
    """
    arch = toolchain.normalize_arch(arch) if arch is not None else toolchain.current_arch()
    headers = cache.header_digest()
    plans = [_plan(s, arch, headers) for s in specs]
    if verbose():
        for plan in plans:
            print(
                f"attnc: module {plan.spec.name}: {printable(str(plan.directory))}", file=sys.stderr
            )
    unique = {p.directory: p for p in plans}.values()  # a module listed twice is built once
    missing = [p for p in unique if not _is_built(p)]
    if missing:
        nvcc = toolchain.runnable_nvcc()
        with cache.file_locks([p.lock for p in missing]):
            missing = [p for p in missing if not _is_built(p, quiet=True)]  # built meanwhile?
            if missing:
                _build_with_progress([p.with_nvcc(nvcc, jobs) for p in missing], jobs, progress)
    return [p.library for p in plans]


def _build_with_progress(
    plans: Sequence[_Plan], jobs: int | None, progress: Progress | None
) -> None:
    for plan in plans:
        _write_files(plan)
        cache.remove_file(plan.stamp)
    start = time.perf_counter()
    try:
        _run_build(plans, jobs, progress)
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
    """Open the shared library at ``path`` with ctypes, once per path, after checking that it
    is a whole ELF file that matches its build record (``built.ok`` beside it). Where the
    record is missing (a rebuild in another process removes it first), the check and the
    opening wait for the module's build lock; a library still without a record then is
    refused (``LibraryRefused``), never opened."""
    key = str(Path(path).resolve())
    with _LIBRARIES_LOCK:
        lib = _LIBRARIES.get(key)
    if lib is None:
        lib = _open_checked(Path(key))
        with _LIBRARIES_LOCK:
            lib = _LIBRARIES.setdefault(key, lib)
    return lib


def _open_checked(library: Path) -> ctypes.CDLL:
    """``library`` opened once it matches its record; without one, under its build lock."""
    stamp = library.parent / "built.ok"
    if os.path.lexists(stamp):
        problem = artifact.library_problem(library, stamp)
        if problem is None:
            return _dlopen(library)
        if os.path.lexists(stamp):  # a damaged library or record, not a rebuild under way
            raise _refused(library, problem)
    with cache.file_lock(build_lock(library.parent)):  # held by a rebuild until its record
        problem = "it has no build record (built.ok)"
        if os.path.lexists(stamp):
            problem = artifact.library_problem(library, stamp)
        if problem is not None:
            raise _refused(library, problem)
        return _dlopen(library)


def _dlopen(library: Path) -> ctypes.CDLL:
    """``library`` opened by the dynamic loader; its refusal (an undefined symbol, a missing
    dependency) is a ``BuildError``: it lasts until the library or the system changes."""
    try:
        return ctypes.CDLL(str(library))
    except OSError as exc:
        raise BuildError(
            f"attnc: the dynamic loader refused {printable(str(library))}: {exc}"
        ) from None


def _refused(library: Path, problem: str) -> LibraryRefused:
    return LibraryRefused(
        f"attnc: refusing to load {printable(str(library))}: {problem}; it is rebuilt "
        "on next use (or clear the cache, ATTNC_CACHE_DIR)"
    )
