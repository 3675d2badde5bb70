"""examples/serve.py --tiny on a GPU: the attnc loop (CUDA-graph decode buckets, chunked paged
prefill) gives the tokens of the same loop with float32 torch attention."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """The environment with the repository first on PYTHONPATH (wheels carried there stay)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def test_serve_tiny_checks_attnc_tokens(tmp_path):
    env = _env()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "serve.py"), "--tiny", "--plot",
         str(tmp_path / "steps.png")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "tiny check:" in proc.stdout and ": ok" in proc.stdout
    assert "[attnc]" in proc.stdout and "generated tokens/s" in proc.stdout


def test_serve_quick_prints_a_json_line_per_backend(tmp_path):
    """The smoke configuration of both backends (FlashInfer when it imports) inside its budget."""
    import json

    env = _env()
    lines = tmp_path / "lines.jsonl"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "serve.py"), "--quick", "--budget", "400",
         "--plot", str(tmp_path / "steps.png"), "--json", str(lines)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {row["backend"]: row for row in map(json.loads, lines.read_text().splitlines())}
    assert "attnc" in rows
    if importlib.util.find_spec("flashinfer") is not None:
        assert "flashinfer" in rows, proc.stdout[-2000:]
    for row in rows.values():
        assert not row["truncated"] and row["finished"] == row["requests"] == 32
        assert row["generated_tokens"] == 32 * 32 and row["generated_tokens_per_s"] > 0
        assert row["step_p99_ms"] >= row["step_p50_ms"] > 0
