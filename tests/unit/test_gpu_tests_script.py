"""scripts/gpu_tests.sh refuses a worker count that is not a whole number before running any
test, and shows the value escaped (control characters included)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_tests.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("workers", ["x", "-1", "2\x1b[31m"])
def test_bad_worker_count_stops_with_a_message(workers):
    env = {**os.environ, "ATTNC_TEST_WORKERS": workers}
    run = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert run.returncode == 2
    assert "ATTNC_TEST_WORKERS must be a whole number" in run.stderr
    assert "\x1b" not in run.stderr and "pytest" not in run.stdout
