"""benchmarks/ab_trees.sh checks its arguments and the interpreter before it runs any tree:
a missing command or tree, a tree without attnc/ (shown escaped, control characters included)
and a python3 that cannot import lark each stop it at once with a message and status 2."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ab_trees.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env)  # fmt: skip


@pytest.mark.parametrize("args", [(), ("benchmarks.plan_time",), ("", str(ROOT))])
def test_usage_without_a_command_or_a_tree(args):
    run = _run(*args)
    assert run.returncode == 2 and "usage: benchmarks/ab_trees.sh" in run.stderr
    assert "===" not in run.stdout


@pytest.mark.parametrize("tree", ["/nonexistent/tree", "w\x1b[31m"])
def test_a_tree_without_attnc_is_refused_before_any_runs(tree):
    run = _run("benchmarks.plan_time", str(ROOT), tree)
    assert run.returncode == 2 and "is not a directory holding attnc/" in run.stderr
    assert "\x1b" not in run.stderr
    assert "===" not in run.stdout  # the good tree did not run either


def test_a_python_without_lark_is_refused(tmp_path):
    (tmp_path / "lark.py").write_text("raise ImportError('no lark here')\n")  # shadows lark
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = _run("benchmarks.plan_time", str(ROOT), env=env)
    assert run.returncode == 2
    assert "cannot import lark" in run.stderr
    assert "--no-deps" in run.stderr  # the install line it suggests works with xdist's wheel
    assert "===" not in run.stdout
