"""The build cache heals itself: nvcc output is checked and renamed into place, the build record
holds size and sha256, a truncated or altered library is rebuilt (never handed to dlopen),
and a held build lock names its holder and times out. nvcc is a fake here (no CUDA needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from fake_nvcc import ELF, installed

from attnc.runtime.build import artifact, cache, jit


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """The fake nvcc (tests/unit/fake_nvcc.py), whose behaviour the test picks through
    ``$FAKE_NVCC_MODE``; its runs are recorded."""
    with installed(tmp_path, monkeypatch) as nvcc:
        yield nvcc


def _build(source: str = "int x;\n") -> Path:
    return jit.build_module("probe", source, arch="80")


def test_failed_nvcc_leaving_a_partial_library_is_not_stamped(fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_MODE", "partial-and-fail")
    with pytest.raises(jit.BuildError, match="exit status 1"):
        _build()
    directory = next(p for p in cache.cache_dir().iterdir() if p.is_dir())
    assert not (directory / "built.ok").exists() and not (directory / "probe.so").exists()
    monkeypatch.setenv("FAKE_NVCC_MODE", "ok")
    library = _build()
    assert fake_nvcc.count() == 2
    assert library.read_bytes() == ELF.read_bytes()


def test_truncated_output_of_a_successful_nvcc_is_rejected(fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_MODE", "partial")
    with pytest.raises(jit.BuildError, match="truncated ELF file"):
        _build()
    assert not list(cache.cache_dir().glob("*/probe.so"))


def test_build_record_holds_size_and_sha256(fake_nvcc):
    library = _build()
    record = (library.parent / "built.ok").read_text()
    assert f'"size": {ELF.stat().st_size}' in record
    assert artifact.file_sha256(ELF) in record


@pytest.mark.parametrize("damage", ["truncate", "flip", "not-elf", "no-record"])
def test_damaged_library_is_rebuilt_and_never_loaded(fake_nvcc, damage, capfd):
    library = _build()
    data = library.read_bytes()
    if damage == "truncate":
        library.write_bytes(data[: len(data) // 3])
    elif damage == "flip":
        library.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "not-elf":
        library.write_bytes(b"\0" * len(data))
    else:
        (library.parent / "built.ok").write_text("{}")
    later = library.stat().st_mtime_ns + 10**9  # damage comes after the build, not in its tick
    os.utime(library, ns=(later, later))
    with pytest.raises(jit.BuildError, match="refusing to load"):
        jit.load_library(library)
    assert _build() == library
    assert fake_nvcc.count() == 2
    assert library.read_bytes() == data
    assert "attnc: rebuilding" in capfd.readouterr().err


def test_cache_hit_runs_no_nvcc(fake_nvcc):
    _build()
    _build()
    assert fake_nvcc.count() == 1


def test_cache_path_with_shell_characters_builds_in_a_plain_directory(
    fake_nvcc, tmp_path, monkeypatch
):
    root = tmp_path / "c$HOME`touch pwned`d"
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(root))
    library = _build()
    assert library.parent.parent == root and library.read_bytes() == ELF.read_bytes()
    ((_, cwd, tmp),) = fake_nvcc.runs()
    assert cache.shell_safe(cwd) and not Path(cwd).exists()  # a temporary, removed directory
    text = (library.parent / "build.ninja").read_text()
    # named relative to the module directory: the path never reaches ninja or its shell
    assert (
        "touch pwned" not in text and "$in" not in text and "build probe.so: nvcc probe.cu" in text
    )


def test_tmpdir_a_shell_would_expand_is_replaced_for_nvcc(fake_nvcc, tmp_path, monkeypatch):
    odd = tmp_path / "t$HOME`x`"
    odd.mkdir()
    monkeypatch.setenv("TMPDIR", str(odd))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    _build()
    ((_, _, tmp),) = fake_nvcc.runs()
    assert cache.shell_safe(tmp) and tmp != str(odd)


def test_shell_safe():
    """Spaces and printable non-ASCII text are plain inside nvcc's double quotes (an install
    under "/home/Jane Doe" was refused every build); what expands there, or is no text, is not."""
    for good in ("/home/u/.cache/attnc/softcap_bf16_d128_0123abcd", "/a b", "/home/Zoë/x"):
        assert cache.shell_safe(good)
    for bad in (
        "/a$HOME",
        "/a`id`",
        '/a"b',
        "/a\\b",
        "/a\nb",
        "/a;b",
        "/a!b",
        "/a\x85b",
        "/a\u202eb",
    ):
        assert not cache.shell_safe(bad)


_HOLDER = """
import sys, time
from pathlib import Path
from attnc.runtime.build import cache
with cache.file_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_lock_held_by_a_hung_builder_names_it_and_times_out(tmp_path, monkeypatch, capfd):
    lock = tmp_path / "m.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "0.5")
        start = time.monotonic()
        with pytest.raises(cache.LockTimeout) as err:
            with cache.file_locks([lock]):
                pass
        assert 0.4 < time.monotonic() - start < 5
        assert f"pid {holder.pid} on host" in str(err.value)
        assert "ATTNC_LOCK_TIMEOUT" in str(err.value)
        assert f"held by pid {holder.pid}" in capfd.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    with cache.file_lock(lock):  # free again once the holder is gone
        assert f"pid {os.getpid()}" in lock.read_text()


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_lock_timeout_must_be_a_duration(monkeypatch, value):
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", value)
    with pytest.raises(ValueError, match="ATTNC_LOCK_TIMEOUT"):
        cache.lock_timeout()


def test_lock_timeout_inf_and_default(monkeypatch):
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "inf")
    assert cache.lock_timeout() == float("inf")
    monkeypatch.delenv("ATTNC_LOCK_TIMEOUT")
    assert cache.lock_timeout() == cache.DEFAULT_LOCK_TIMEOUT_S


def test_elf_problem(tmp_path):
    assert artifact.elf_problem(ELF) is None
    short = tmp_path / "short.so"
    short.write_bytes(ELF.read_bytes()[:4096])
    assert "truncated" in str(artifact.elf_problem(short))
    assert artifact.elf_problem(tmp_path / "missing.so") is not None
    shutil.copyfile(ELF, tmp_path / "whole.so")
    assert artifact.elf_problem(tmp_path / "whole.so") is None


def _hold(lock: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_file_deleted_while_waiting_for_it_is_opened_again(tmp_path, monkeypatch):
    """A builder waiting on the lock file, which was then deleted (the cache cleared) and
    created again and taken by a third builder, got the deleted file's lock once its holder
    left: two builders in one module directory at once. The waiter now opens the path
    again and waits for the third."""
    lock = tmp_path / "m.lock"
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "3")
    first = _hold(lock)
    outcome: list[object] = []

    def wait_for_lock() -> None:
        try:
            with cache.file_lock(lock):
                outcome.append("entered")
        except cache.LockTimeout as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_lock)
    third = None
    try:
        waiter.start()
        time.sleep(0.3)  # the waiter has the first file open and polls it
        lock.unlink()
        third = _hold(lock)  # a new file at the path
        first.kill()
        first.wait()
        waiter.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], cache.LockTimeout)
        assert f"pid {third.pid} on host" in str(outcome[0])
    finally:
        for p in (first, third):
            if p is not None:
                p.kill()
                p.wait()
        waiter.join(10)


_BUILDER = """
import sys
from pathlib import Path
from attnc.runtime.build import cache, nvcc_run
with cache.file_lock(Path(sys.argv[1])):
    print("held", flush=True)
    nvcc_run.run_steps(nvcc_run.Steps((), ("sh", "-c", "sleep 2")), Path("."))
"""


def test_a_builder_killed_mid_nvcc_keeps_the_lock_until_nvcc_exits(tmp_path, monkeypatch):
    """A builder killed while nvcc ran released its lock at once, and the next builder ran
    nvcc into the same files as the orphaned one. The build commands now inherit the lock."""
    lock = tmp_path / "m.lock"
    builder = subprocess.Popen(
        [sys.executable, "-c", _BUILDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert builder.stdout is not None and builder.stdout.readline().strip() == "held"
    time.sleep(0.3)  # the command has started
    builder.kill()
    builder.wait()
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "0.3")
    with pytest.raises(cache.LockTimeout):
        with cache.file_lock(lock):
            pass
    monkeypatch.setenv("ATTNC_LOCK_TIMEOUT", "10")
    start = time.monotonic()
    with cache.file_lock(lock):  # free once the orphaned command exits
        assert time.monotonic() - start < 5


_SLOW_NVCC = """#!/bin/sh
case " $* " in *" --version "*) echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0;; esac
echo $$ >> "$NVCC_PIDS"
exec sleep 30
"""

_INTERRUPTED = """
import os, signal, sys, threading, time
from attnc.runtime.build import jit

# A shell's background job starts with SIGINT ignored, and Python keeps it so: take Ctrl-C.
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupt():  # twice, to the process (as a notebook's "interrupt kernel" does)
    time.sleep(1.0); os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5); os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
try:
    jit.build_module("slow", 'extern "C" int attnc_slow(void) { return 1; }', arch="80")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_stops_nvcc_before_the_build_lock_is_released(tmp_path):
    """nvcc runs in worker threads, which Ctrl-C never reaches: after two interrupts the
    build returned and released its lock with nvcc still running (and writing into the
    module directory beside the next builder). Now every running nvcc is killed first."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(_SLOW_NVCC)
    nvcc.chmod(0o755)
    pids = tmp_path / "pids"
    pids.touch()
    env = {
        **os.environ,
        "ATTNC_NVCC": str(nvcc),
        "ATTNC_CACHE_DIR": str(tmp_path / "cache"),
        "NVCC_PIDS": str(pids),
    }
    run = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED], env=env, capture_output=True, text=True, timeout=60
    )
    assert "interrupted" in run.stdout, run.stderr
    started = pids.read_text().split()
    assert started, "nvcc never ran"
    time.sleep(0.2)
    assert all(not Path(f"/proc/{pid}").exists() for pid in started)
