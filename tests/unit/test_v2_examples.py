"""The language-v2 examples (gpt-oss sinks, packed documents, per-request prefix-LM windows)
run on the CPU: each checks its variant's fp64 reference against attention written another
way (the sink column softmax, causal per document, prefix_lm per request)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "gpt_oss.py": "layer 3 gpt_oss_full: reference vs written-out sink softmax",
    "packed_documents.py": "packed reference vs causal per document",
    "prefix_lm_windows.py": "request 3 (prefix 64): reference vs prefix_lm",
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_runs_on_cpu(script: str) -> None:
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert SCRIPTS[script] in proc.stdout
    assert "no CUDA device: the kernels were not run" in proc.stdout
