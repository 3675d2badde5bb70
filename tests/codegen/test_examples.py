"""The shipped examples compile, pass the host harness, and the example script runs (CPU)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {
        "gemma_local.attn",
        "chunked_local.attn",
        "gated_alibi.attn",
    }


@pytest.mark.nvcc
@pytest.mark.skipif(
    shutil.which("nvcc") is None and shutil.which("g++") is None, reason="no compiler"
)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_passes_host_harness(path):
    compiled, warnings = compile_source(path.read_text(), str(path))
    assert compiled and not warnings
    for c in compiled:
        report = run_host_test(c, points=600, seed=1)
        assert report.ok, report.summary()


def test_example_script_runs_on_cpu():
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(path))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "run_variant.py"),
         str(ROOT / "examples" / "gemma_local.attn"), "--variant", "gemma_local"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    assert "Variant('gemma_local', params=[cap, window])" in out
    assert "float32 reference vs float64:" in out
