"""``attnc build -j N`` runs at most N nvcc processes at once, each with its share of the CPUs
(``-split-compile``). Before, the two sources of a Hopper module were compiled side by side
whatever N, each nvcc told to use every CPU (``-split-compile=0``). A fake nvcc (no CUDA
needed) logs when each run starts and ends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from attnc import cli
from attnc.runtime.build import toolchain

_SCRIPT = """\
#!{python}
import json, os, sys, time
if "--version" in sys.argv:
    print("Cuda compilation tools, release 13.0, V13.0.48")
    sys.exit(0)
start = time.monotonic()
time.sleep(0.4)
out = sys.argv[sys.argv.index("-o") + 1]
with open(sys.executable, "rb") as src, open(out, "wb") as dst:
    dst.write(src.read())
split = [a for a in sys.argv if a.startswith("-split-compile")]
with open(os.environ["JOBS_LOG"], "a") as log:
    log.write(json.dumps([start, time.monotonic(), split]) + "\\n")
"""


@pytest.fixture
def timed_nvcc(tmp_path, monkeypatch):
    """A fake nvcc that takes 0.4 s a run and logs [start, end, its -split-compile flags]."""
    script = tmp_path / "nvcc"
    script.write_text(_SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "runs.log"
    monkeypatch.setenv("ATTNC_NVCC", str(script))
    monkeypatch.setenv("JOBS_LOG", str(log))
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("ATTNC_VERBOSE", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN"):
        monkeypatch.delenv(name, raising=False)
    toolchain.nvcc_version.cache_clear()
    yield log
    toolchain.nvcc_version.cache_clear()


def _most_at_once(runs: list[list]) -> int:
    events = sorted([(r[0], 1) for r in runs] + [(r[1], -1) for r in runs])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_bound_the_nvcc_processes(timed_nvcc: Path, jobs: int, capsys) -> None:
    argv = ["build", "stdlib:causal", "--arch", "90a", "--kind", "prefill", "--head-dim", "64"]
    assert cli.main([*argv, "-j", str(jobs)]) == 0
    runs = [json.loads(line) for line in timed_nvcc.read_text().splitlines()]
    # The FA2 module, the Hopper module's two sources and their link, the host planner.
    assert len(runs) >= 4
    assert _most_at_once(runs) <= jobs
    threads = max(1, len(os.sched_getaffinity(0)) // jobs)
    device = [tuple(r[2]) for r in runs if r[2]]  # the host planner has no device code
    assert len(device) >= 3 and set(device) == {(f"-split-compile={threads}",)}


def test_without_jobs_every_cpu_is_used(timed_nvcc: Path, capsys) -> None:
    """The default build keeps its speed: two sources side by side, every nvcc on every CPU."""
    argv = ["build", "stdlib:causal", "--arch", "90a", "--kind", "prefill", "--head-dim", "64"]
    assert cli.main(argv) == 0
    runs = [json.loads(line) for line in timed_nvcc.read_text().splitlines()]
    assert _most_at_once(runs) >= 2
    device = [tuple(r[2]) for r in runs if r[2]]
    assert len(device) >= 3 and set(device) == {("-split-compile=0",)}
