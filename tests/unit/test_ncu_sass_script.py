"""scripts/ncu_sass.sh checks its arguments before it looks for Nsight Compute: a missing
command or a TAG that is not a plain file-name stem (it names the output files) stops it with
a message, the TAG shown escaped (control characters included)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ncu_sass.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


def test_usage_without_a_command():
    run = _run("win")
    assert run.returncode == 2 and "usage: scripts/ncu_sass.sh TAG COMMAND" in run.stderr


@pytest.mark.parametrize("tag", ["../x", "a b", "w\x1b[31m", ""])
def test_a_tag_that_is_not_a_file_stem_is_refused(tag):
    run = _run(tag, "true")
    assert run.returncode == 2
    assert "TAG must be letters, digits" in run.stderr
    assert "\x1b" not in run.stderr
