"""Every benchmark variant's 8K prefill (default backend: the Hopper template on sm_90),
called 60 times in a child process that must finish within a deadline, with the last
output equal to the first bit for bit (the kernels are deterministic). A kernel that hangs,
fails or races only now and then fails here; one call per case, as in the other GPU tests,
can pass. Runs ``python -m benchmarks.stress_prefill``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.workloads import VARIANTS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_repeated_prefill_finishes_and_repeats_itself(name):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "benchmarks.stress_prefill", "--variants", name,
           "--calls", "60", "--deadline", "120"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.split()[:2] == [name, "ok:"], line
