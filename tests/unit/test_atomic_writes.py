"""Files written through a temporary file renamed over them (the build cache's generated
sources and records): two writers at once, the mode a new file gets, and a failed write.

``cache.write_if_changed`` named its temporary file after the process id alone, so two threads
of one process writing the same path at once shared it: the first rename moved it away and
the second failed with ``FileNotFoundError`` (or wrote into the file the first had renamed)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from attnc.regular_file import write_atomically
from attnc.runtime.build import cache


def _barrier_before_rename(monkeypatch: pytest.MonkeyPatch, parties: int) -> None:
    """Every ``os.replace`` waits until ``parties`` of them are under way: each writer has
    written its temporary file before any renames one."""
    barrier = threading.Barrier(parties, timeout=10)
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        barrier.wait()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_two_threads_writing_one_path_at_once_both_succeed(tmp_path, monkeypatch) -> None:
    target = tmp_path / "module.cu"
    texts = ["a" * 5000, "b" * 3000]
    _barrier_before_rename(monkeypatch, len(texts))
    errors: list[BaseException] = []

    def write(text: str) -> None:
        try:
            cache.write_if_changed(target, text)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert errors == []
    assert target.read_text() in texts  # one whole text, never a mix of the two
    assert [p.name for p in tmp_path.iterdir()] == ["module.cu"]


def test_a_written_file_takes_the_umask(tmp_path) -> None:
    before = os.umask(0o027)
    try:
        assert cache.write_if_changed(tmp_path / "built.ok", "record")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "built.ok").stat().st_mode) == 0o640


_TOO_LARGE = """
import resource, signal, sys
from pathlib import Path
from attnc.regular_file import write_atomically
from attnc.runtime.build import cache
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    cache.write_if_changed(Path(sys.argv[1]), "record")
except OSError as exc:
    print(type(exc).__name__, exc.errno, exc)
"""


def test_a_write_the_system_cuts_short_leaves_no_temporary_file(tmp_path) -> None:
    """A file size limit (as a full disk would) stops the write after one byte: the error
    names the file, and neither the file nor a temporary one is left."""
    target = tmp_path / "built.ok"
    done = subprocess.run(
        [sys.executable, "-c", _TOO_LARGE, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.startswith("OSError 27 [Errno 27] cannot write "), done.stdout + done.stderr
    assert "built.ok: File too large" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_replaces_a_link_rather_than_writing_through_it(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"kept")
    (tmp_path / "out").symlink_to(elsewhere)
    write_atomically(tmp_path / "out", b"new", ".out.")
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"new"
    assert elsewhere.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]


def test_write_atomically_leaves_no_temporary_file_when_the_rename_fails(tmp_path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomically(tmp_path / "out", b"new", ".out.")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
