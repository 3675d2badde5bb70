"""Builds a host-only C++ fixture (a `.cu` file in tests/codegen/fixtures that includes kernel
headers and runs their `__host__ __device__` code on the CPU) with nvcc, for the codegen tests
that check kernel helpers against brute force."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attnc.runtime.build import toolchain

INCLUDE = Path(__file__).resolve().parents[2] / "attnc" / "kernels" / "include"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The marks of every test module that builds a fixture.
NVCC_MARKS = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]


def _harness_compiler_found() -> bool:
    """Whether attnc.testing.host_test finds a compiler for the host harness: an nvcc
    (``toolchain.find_nvcc``: $ATTNC_NVCC, $CUDA_HOME's, PATH's) or g++."""
    try:
        toolchain.find_nvcc()
    except toolchain.ToolNotFound:
        return shutil.which("g++") is not None
    return True


# The marks of every test module that runs the host harness (attnc.testing.host_test builds
# it with nvcc, CUDA_HOME's nvcc or g++).
HARNESS_MARKS = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not _harness_compiler_found(), reason="needs nvcc or g++"),
]


def build_host_fixture(name: str, out: Path) -> Path:
    """Compile fixtures/``name`` into the executable ``out``; fails the test with nvcc's output."""
    cmd = ["nvcc", "-std=c++17", "-O1", f"-I{INCLUDE}", str(FIXTURES / name), "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert build.returncode == 0, f"{' '.join(cmd)}\n{build.stdout}{build.stderr}"
    return out
