"""Owns: the nvcc commands that build one module's library, and running them (no shell).

A module of one source is one command (``nvcc -shared -o LIB SRC``). A module of several
sources (a Hopper prefill module whose two kernels compile apart, see
``attnc/codegen/module.py``) compiles each source to an object in parallel, then links the
objects into the library: nvcc compiles a translation unit's kernels one after the other, so
the wall time becomes that of the longest source. Every command ends in ``-o OUTPUT INPUT...``
(``ninja_build.py`` reads them so).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnc.runtime.build import cache


@dataclass(frozen=True)
class Steps:
    """The commands that build ``output``: ``objects`` (run in parallel, none for a module of
    one source), then ``final``, which writes ``output``."""

    objects: tuple[tuple[str, ...], ...]
    final: tuple[str, ...]

    def all(self) -> tuple[tuple[str, ...], ...]:
        """Every command, in an order that builds the library."""
        return (*self.objects, self.final)


@dataclass(frozen=True)
class Outcome:
    """What the commands did: the last one run, its output, and why it failed (or None);
    ``repeat``, the commands that repeat a failure when ``command`` alone does not (a link,
    whose objects are removed: the object commands, then the link)."""

    command: tuple[str, ...]
    output: str
    failure: str | None
    repeat: tuple[tuple[str, ...], ...] = ()

    def commands_to_repeat(self) -> tuple[tuple[str, ...], ...]:
        """The commands that repeat this outcome, in order."""
        return self.repeat or (self.command,)


def object_path(source: Path) -> Path:
    """The object file one source of a module of several compiles to."""
    return source.with_suffix(".o")


def steps(nvcc: str, flags: Sequence[str], sources: Sequence[Path], output: Path) -> Steps:
    """The commands that build ``output`` from ``sources`` with ``flags`` (which hold
    ``-shared``: for several sources each object takes ``-c`` in its place)."""
    if not sources:
        raise ValueError("a module needs at least one source")
    if len(sources) == 1:
        return Steps((), (nvcc, *flags, "-o", str(output), str(sources[0])))
    object_flags = ["-c" if f == "-shared" else f for f in flags]
    objects = tuple((nvcc, *object_flags, "-o", str(object_path(s)), str(s)) for s in sources)
    link = (nvcc, "-shared", "-o", str(output), *(str(object_path(s)) for s in sources))
    return Steps(objects, link)


class Running:
    """The commands of one build that run now, so that all of them stop at once: Ctrl-C
    reaches only the main thread, while the commands run in worker threads. ``limit``: how
    many may run at once (None: no limit; ``attnc build -j``)."""

    def __init__(self, limit: int | None = None) -> None:
        self._procs: set[subprocess.Popen[str]] = set()
        self._stopped = False
        self._guard = threading.Lock()
        self.slots = threading.BoundedSemaphore(limit) if limit else None

    def start(
        self, command: Sequence[str], cwd: Path, env: Mapping[str, str] | None
    ) -> subprocess.Popen[str] | None:
        """``command`` started (its output piped), or None once ``stop`` was called."""
        with self._guard, cache.inherited_lock_fds() as lock_fds:  # held while nvcc runs
            if self._stopped:
                return None
            proc = subprocess.Popen(
                list(command), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", env=env, pass_fds=lock_fds,
            )  # fmt: skip
            self._procs.add(proc)
            return proc

    def finished(self, proc: subprocess.Popen[str]) -> None:
        """``proc`` has exited."""
        with self._guard:
            self._procs.discard(proc)

    def stop(self) -> None:
        """Kill every running command, and start no more."""
        with self._guard:
            self._stopped = True
            for proc in self._procs:
                kill_group(proc)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` and what it started (nvcc runs cicc, ptxas, the host compiler, which
    keep its output pipe open: the caller's wait would last until they finish). They stay
    in the caller's process group, so a signal to that group (Ctrl-C, ``timeout``) still
    reaches them; their process IDs are read from /proc where there is one. Nothing is sent
    once ``proc`` has been reaped (its ID may name another process by then)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGSTOP)  # it starts no more while its descendants are listed
    below = _descendants(proc.pid)
    proc.kill()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """The process IDs below ``root``, read from Linux's /proc (an empty list elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat_line = f.read()
        except OSError:
            continue
        fields = stat_line[stat_line.rfind(b")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.extend(below)
        todo.extend(below)
    return found


def _run(
    command: Sequence[str], cwd: Path, env: Mapping[str, str] | None, running: Running
) -> Outcome:
    if running.slots is None:
        return _run_now(command, cwd, env, running)
    with running.slots:
        return _run_now(command, cwd, env, running)


def _run_now(
    command: Sequence[str], cwd: Path, env: Mapping[str, str] | None, running: Running
) -> Outcome:
    try:
        proc = running.start(command, cwd, env)
    except OSError as exc:
        return Outcome(tuple(command), "", f"cannot run {command[0]}: {exc}")
    if proc is None:
        return Outcome(tuple(command), "", "stopped (the build was interrupted)")
    with proc:
        try:
            output, _ = proc.communicate()
        except BaseException:  # Ctrl-C in this thread: do not leave nvcc running
            kill_group(proc)
            raise
        finally:
            running.finished(proc)
    failure = None if proc.returncode == 0 else f"(exit status {proc.returncode})"
    return Outcome(tuple(command), output, failure)


def run_steps(
    build: Steps,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    running: Running | None = None,
) -> Outcome:
    """Run ``build``'s object commands in parallel, then its final command unless one failed
    (the first failure is returned); the objects are removed either way, so a failed link
    is repeated by every command. ``running``: where the commands are registered while they
    run (so that the caller can stop them)."""
    running = running or Running()
    try:
        if build.objects:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(build.objects)) as pool:
                outcomes = list(pool.map(lambda c: _run(c, cwd, env, running), build.objects))
            failed = [o for o in outcomes if o.failure is not None]
            if failed:
                return failed[0]
        outcome = _run(build.final, cwd, env, running)
        if outcome.failure is not None and build.objects:
            return dataclasses.replace(outcome, repeat=build.all())
        return outcome
    finally:
        for command in build.objects:
            Path(command[-2]).unlink(missing_ok=True)
