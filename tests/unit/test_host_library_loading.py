"""Loading the host planner libraries: a passing failure (a build lock held past the timeout,
an interrupted build) is not remembered by the load-once state, a library without its build
record is opened only under its build lock, and a child forked while another thread loads a
library loads it itself. nvcc is a fake here (no CUDA needed)."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import os
import shutil
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_nvcc import ELF, installed

from attnc.runtime.build import artifact, cache, jit
from attnc.runtime.build.host_library import OnceLibrary, PlannerUnavailable


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """The fake nvcc (tests/unit/fake_nvcc.py), with a cache of the test's own."""
    with installed(tmp_path, monkeypatch) as nvcc:
        yield nvcc


def _build() -> Path:
    return jit.build_module("probe", "int x;\n", arch="80")


@contextlib.contextmanager
def _held(lock: Path) -> Iterator[None]:
    """``lock`` held as another process holds it (an open file of its own)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _once(load: Callable[[], object]) -> OnceLibrary:
    return OnceLibrary(load, PlannerUnavailable)  # type: ignore[arg-type]


# 1. Passing failures are tried again; lasting ones are not


def test_a_lock_timeout_is_not_remembered(fake_nvcc, monkeypatch):
    lock = jit.build_lock(_build().parent)
    shutil.rmtree(lock.with_suffix(""))  # not built: another process builds it now
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "0")
    once = _once(lambda: _build().read_bytes())
    with _held(lock), pytest.raises(PlannerUnavailable, match="LockTimeout"):
        once.get()
    assert not once.settled  # nothing remembered: the next plan() builds
    assert once.get() == ELF.read_bytes() and fake_nvcc.count() == 2


@pytest.mark.parametrize(
    "error",
    [
        jit.BuildError("attnc: nvcc failed\ncompiler output:\n(exit status -9)"),
        jit.LibraryRefused("attnc: refusing to load x.so: it has no build record"),
        cache.LockTimeout("attnc: gave up waiting for the build lock"),
        OSError(28, "No space left on device"),
    ],
)
def test_a_passing_failure_is_tried_again(error):
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return "lib"

    once = _once(load)
    with pytest.raises(PlannerUnavailable, match=type(error).__name__) as raised:
        once.get()
    assert raised.value.__context__ is error  # `except LockTimeout` finds it (it was text only)
    assert once.get() == "lib" and calls == [1, 1]


def test_a_lasting_failure_is_remembered():
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        raise jit.BuildError("attnc: nvcc failed\ncompiler output:\nerror\n(exit status 2)")

    once = _once(load)
    contexts = []
    for _ in range(3):
        with pytest.raises(PlannerUnavailable, match="exit status 2") as raised:
            once.get()
        contexts.append(type(raised.value.__context__))
    assert calls == [1] and once.settled
    assert contexts == [jit.BuildError, type(None), type(None)]  # the call that built keeps it


def test_a_lasting_failure_of_the_background_load_is_kept_once():
    """plan()'s first call on a GPU loads the planner in the background: its lasting
    BuildError was not kept, though a foreground one was."""
    once = _once(lambda: _raise(jit.BuildError("attnc: nvcc failed\n(exit status 2)")))
    once.load_in_background("test-load").join()
    contexts = []
    for _ in range(2):
        with pytest.raises(PlannerUnavailable, match="exit status 2") as raised:
            once.get()
        contexts.append(type(raised.value.__context__))
    assert contexts == [jit.BuildError, type(None)]
    assert not raised.value.__suppress_context__  # a remembered one hides no context


def _failed_planner_build(monkeypatch, background: bool) -> PlannerUnavailable:
    """The prefill planner built by the fake nvcc failing with a compiler error (its state
    reset for the test), raised by ``library()`` after a foreground or a background build."""
    from attnc.runtime.planning import prefill_plan_library as planner

    monkeypatch.setenv("FAKE_NVCC_MODE", "always")
    for name in ("lib", "failure", "_background_failure"):
        monkeypatch.setattr(planner.ONCE, name, None)
    if background:
        planner.build_in_background().join()
    with pytest.raises(PlannerUnavailable) as raised:
        planner.library()
    return raised.value


@pytest.mark.parametrize("background", [False, True])
def test_a_failed_planner_build_shows_nvccs_command_and_output_once(
    fake_nvcc, monkeypatch, background
):
    """An uncaught PlannerUnavailable printed nvcc's command and output twice: in its own
    message and again in the BuildError chained as its ``__cause__``. Its message says them
    (as ``str()`` and the CLI's ``attnc: error:`` show it) on every raise; the first raise
    keeps the BuildError as its ``__context__``, not displayed."""
    first = _failed_planner_build(monkeypatch, background)
    output = "probe.cu(1): error: expected a ';'"  # the fake nvcc's compiler error
    from attnc.runtime.planning import prefill_plan_library as planner

    for err in (first, pytest.raises(PlannerUnavailable, planner.library).value):
        printed = "".join(traceback.format_exception(err))
        assert printed.count(output) == 1 and printed.count("  command: ") == 1, printed
        assert "prefill_plan.cpp" in str(err) and output in str(err) and "command: " in str(err)
    assert isinstance(first.__context__, jit.BuildError) and first.__suppress_context__
    assert fake_nvcc.count() == 1  # the failure lasts: the second call did not build again


def test_the_failure_is_kept_as_the_context_inside_a_callers_except(fake_nvcc, monkeypatch):
    """plan() called while its caller handles another exception: the build's error is still
    the context (Python sets a raise's context to the exception being handled)."""
    try:
        raise KeyError("the caller's")
    except KeyError:
        err = _failed_planner_build(monkeypatch, background=False)
    assert isinstance(err.__context__, jit.BuildError)
    assert "KeyError" not in "".join(traceback.format_exception(err))


class _Big:
    """Stands for plan()'s tensors: whether a failed get() keeps its caller's locals."""


@pytest.mark.parametrize("lasting", [False, True])
def test_a_failed_get_keeps_no_frame_alive(lasting):
    """The kept failure's traceback led back to get()'s frame, which held the failure:
    a cycle that kept the caller's locals (plan()'s tensors) until the collector ran. A
    remembered failure (the second call after a lasting one) holds none either."""
    if lasting:
        once = _once(lambda: _raise(jit.BuildError("attnc: nvcc failed\n(exit status 2)")))
        with pytest.raises(PlannerUnavailable):
            once.get()
    else:
        once = _once(lambda: _raise(cache.LockTimeout("attnc: gave up waiting for the lock")))
    ref = None

    def plan() -> None:
        nonlocal ref
        big = _Big()
        ref = weakref.ref(big)
        once.get()

    gc.disable()
    try:
        with pytest.raises(PlannerUnavailable):
            plan()
        assert ref is not None and ref() is None  # freed at once, without gc.collect()
    finally:
        gc.enable()


def _raise(error: Exception) -> str:
    raise error


def test_a_passing_failure_of_the_background_load_is_raised_without_a_second_try():
    """plan() starts the load in the background, joins it, then asks for the library: a
    lock timeout there was tried again at once, so the first plan() waited twice the
    timeout before it raised."""
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise cache.LockTimeout("attnc: gave up waiting for the build lock")
        return "lib"

    once = _once(load)
    once.load_in_background("test-load").join()
    with pytest.raises(PlannerUnavailable, match="LockTimeout") as raised:
        once.get()
    assert isinstance(raised.value.__context__, cache.LockTimeout)
    assert calls == [1]
    assert once.get() == "lib" and calls == [1, 1]


def test_the_dynamic_loaders_refusal_lasts(tmp_path):
    """ctypes' OSError (an undefined symbol, a missing dependency) was taken for a passing
    failure: every plan() checked the build and called dlopen again."""
    from attnc.runtime.build.host_library import passing

    bad = tmp_path / "not_a_library.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(jit.BuildError, match="dynamic loader refused") as err:
        jit._dlopen(bad)
    assert not passing(err.value)


# 2. A library without its build record is opened only under its build lock


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The sha256 of each library ctypes opens (its bytes at that moment), in place of
    opening it."""
    digests: list[str] = []

    def cdll(path: str) -> str:
        digests.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        return f"lib {len(digests)}"

    monkeypatch.setattr(jit.ctypes, "CDLL", cdll)
    return digests


def _start_rebuild(library: Path) -> bytes:
    """What another process's rebuild does first (under the build lock): remove the record;
    the library is altered meanwhile. Returns the library's sound bytes."""
    data = library.read_bytes()
    (library.parent / "built.ok").unlink()
    library.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])  # ELF still whole
    return data


def _finish_rebuild(library: Path, data: bytes) -> None:
    library.write_bytes(data)
    record = artifact.record_text(library, "nvcc", library.parent.name, None)
    (library.parent / "built.ok").write_text(record)


def test_a_library_without_its_record_waits_for_the_rebuild(fake_nvcc, opened):
    library = _build()
    loaded: list[object] = []
    with _held(jit.build_lock(library.parent)):
        data = _start_rebuild(library)
        thread = threading.Thread(target=lambda: loaded.append(jit.load_library(library)))
        thread.start()
        thread.join(0.5)
        assert opened == []  # the altered library is never opened
        _finish_rebuild(library, data)
    thread.join(5)
    assert opened == [hashlib.sha256(data).hexdigest()] and loaded == ["lib 1"]


def test_a_library_without_its_record_is_not_opened_while_a_build_holds_the_lock(
    fake_nvcc, opened, monkeypatch
):
    library = _build()
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "0")
    with _held(jit.build_lock(library.parent)):
        _start_rebuild(library)
        with pytest.raises(cache.LockTimeout):
            jit.load_library(library)
    assert opened == []


def test_a_library_left_without_its_record_is_refused_and_rebuilt(fake_nvcc, opened):
    library = _build()
    _start_rebuild(library)
    with pytest.raises(jit.LibraryRefused, match="no build record"):
        jit.load_library(library)
    assert opened == []
    assert _build() == library and fake_nvcc.count() == 2
    assert jit.load_library(library) == "lib 1" and len(opened) == 1


# 3. A child forked while another thread loads the library


def _in_child(body: Callable[[], bool]) -> bool:
    """True when ``body`` returned True in a forked child within 5 s (a hung child is
    killed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if body() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def test_a_child_forked_during_the_first_load_loads_the_library():
    parent, release = os.getpid(), threading.Event()

    def load() -> str:
        if os.getpid() == parent:
            release.wait(10)
        return f"lib of {os.getpid()}"

    once = _once(load)
    thread = threading.Thread(target=once.get)
    thread.start()
    while not once._lock.locked():
        time.sleep(0.001)
    try:
        assert _in_child(lambda: once.get() == f"lib of {os.getpid()}")
    finally:
        release.set()
        thread.join(10)
    assert once.get() == f"lib of {parent}"


def test_a_child_forked_while_a_build_starts_nvcc_holds_no_build_lock():
    taken, release = threading.Event(), threading.Event()

    def starting_nvcc() -> None:
        with cache.inherited_lock_fds():
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=starting_nvcc)
    thread.start()
    taken.wait(10)
    cache._HELD_LOCK_FDS.add(999)  # a lock the parent holds
    try:

        def child() -> bool:
            with cache.inherited_lock_fds() as fds:
                return fds == ()

        assert _in_child(child)
    finally:
        cache._HELD_LOCK_FDS.discard(999)
        release.set()
        thread.join(10)
