"""The fake nvcc of the build tests (no CUDA needed): one script and the environment around it.

This module owns the fake compiler that the unit tests of the build cache run in place of
nvcc. ``installed(tmp_path, monkeypatch)`` writes it to ``tmp_path/bin/nvcc``, points
``ATTNC_NVCC`` at it, gives the test its own ``ATTNC_CACHE_DIR``, clears the variables that
would change what it does (``ATTNC_VERBOSE``, ``NVCC_APPEND_FLAGS``, ``NVCC_PREPEND_FLAGS``,
``NVCC_CCBIN``, ``FAKE_NVCC_MODE``, ``FAKE_NVCC_RELEASE``) and the per-process cache of
``toolchain.nvcc_version``, before and after. The test files' ``fake_nvcc`` fixtures wrap it.

The script:

* ``--version`` prints ``Cuda compilation tools, release X, VX.93``, X from
  ``$FAKE_NVCC_RELEASE`` (default 12.8);
* any other run appends one JSON line to ``$FAKE_NVCC_LOG``: its argv, working directory and
  ``TMPDIR`` (null where unset), read back by ``FakeNvcc.runs()``;
* fails as nvcc does where an input after ``-o OUT`` is not a file;
* else acts by ``$FAKE_NVCC_MODE``: ``ok`` (default) copies a whole ELF file (this Python
  interpreter) to ``OUT``; ``always`` fails with a compiler error, ``link`` fails only the
  link of object files; ``partial`` writes the first half of the ELF file and exits 0,
  ``partial-and-fail`` writes it and exits 1; ``fifo`` and ``directory`` leave a named pipe or
  a directory at ``OUT`` and exit 0. Any other mode fails with exit status 3.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from attnc.runtime.build import toolchain

ELF = Path(sys.executable).resolve()  # any whole 64-bit ELF file stands in for a library

MODES = ("ok", "always", "link", "partial", "partial-and-fail", "fifo", "directory")

_SCRIPT = """\
#!{python}
import json, os, sys
if "--version" in sys.argv:
    release = os.environ.get("FAKE_NVCC_RELEASE", "12.8")
    print(f"Cuda compilation tools, release {{release}}, V{{release}}.93")
    sys.exit(0)
run = {{"argv": sys.argv, "cwd": os.getcwd(), "tmpdir": os.environ.get("TMPDIR")}}
with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
    log.write(json.dumps(run) + "\\n")
at = sys.argv.index("-o")
out, inputs = sys.argv[at + 1], sys.argv[at + 2 :]
missing = [i for i in inputs if not os.path.isfile(i)]
if missing:
    print("nvcc fatal   : Could not open input file", missing[0])
    sys.exit(1)
mode = os.environ.get("FAKE_NVCC_MODE") or "ok"
if mode not in {modes!r}:
    print("fake nvcc: unknown FAKE_NVCC_MODE", repr(mode))
    sys.exit(3)
linking = "-c" not in sys.argv and bool(inputs) and inputs[0].endswith(".o")
if mode == "always" or (mode == "link" and linking):
    print("probe.cu(1): error: expected a ';'")
    sys.exit(2)
if mode in ("fifo", "directory"):
    os.mkfifo(out) if mode == "fifo" else os.mkdir(out)
    sys.exit(0)
data = open({elf!r}, "rb").read()
with open(out, "wb") as f:
    f.write(data if mode in ("ok", "link") else data[: len(data) // 2])
sys.exit(1 if mode == "partial-and-fail" else 0)
"""


class Run(NamedTuple):
    """One run of the fake nvcc (``--version`` aside)."""

    argv: list[str]
    cwd: str
    tmpdir: str | None


@dataclass(frozen=True)
class FakeNvcc:
    """The installed script and its log of runs."""

    script: Path
    log: Path

    def runs(self) -> list[Run]:
        """Every run so far, oldest first."""
        return [Run(**json.loads(line)) for line in self.log.read_text().splitlines()]

    def count(self) -> int:
        """The number of runs so far."""
        return len(self.runs())

    def argvs(self) -> list[list[str]]:
        """The command line of every run so far, oldest first."""
        return [run.argv for run in self.runs()]


def write_script(path: Path) -> Path:
    """Write the fake nvcc to ``path`` (its folder made), executable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_SCRIPT.format(python=sys.executable, modes=MODES, elf=str(ELF)))
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvcc]:
    """The fake nvcc at ``tmp_path/bin/nvcc`` as the build's nvcc, the cache under
    ``tmp_path/cache``; ``toolchain.nvcc_version`` forgotten on entry and on exit."""
    nvcc = FakeNvcc(write_script(tmp_path / "bin" / "nvcc"), tmp_path / "nvcc.log")
    nvcc.log.write_text("")
    monkeypatch.setenv("ATTNC_NVCC", str(nvcc.script))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(nvcc.log))
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    for name in (
        "ATTNC_VERBOSE",
        "FAKE_NVCC_MODE",
        "FAKE_NVCC_RELEASE",
        "NVCC_APPEND_FLAGS",
        "NVCC_PREPEND_FLAGS",
        "NVCC_CCBIN",
    ):
        monkeypatch.delenv(name, raising=False)
    toolchain.nvcc_version.cache_clear()
    try:
        yield nvcc
    finally:
        toolchain.nvcc_version.cache_clear()
