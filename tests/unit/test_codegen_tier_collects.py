"""The codegen tier's host-harness marks are decided without error on a machine where nvcc is
not on PATH (collection imported a helper the harness no longer has)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CODEGEN = Path(__file__).resolve().parents[1] / "codegen"


def test_host_fixture_imports_without_nvcc_on_path() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = os.path.dirname(sys.executable)  # no nvcc, no g++ (only Python)
    env.pop("ATTNC_NVCC", None)
    code = (
        f"import sys; sys.path.insert(0, {str(CODEGEN)!r}); import host_fixture; "
        "print(host_fixture.HARNESS_MARKS[1].kwargs['reason'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "needs nvcc or g++"
