"""examples/serve.py --tiny on a GPU: the attnc loop (CUDA-graph decode buckets, chunked paged
prefill) gives the tokens of the same loop with float32 torch attention."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_serve_tiny_checks_attnc_tokens(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "serve.py"), "--tiny", "--plot",
         str(tmp_path / "steps.png")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "tiny check:" in proc.stdout and ": ok" in proc.stdout
    assert "[attnc]" in proc.stdout and "generated tokens/s" in proc.stdout
