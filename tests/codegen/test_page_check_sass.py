"""The device page-id check is compiled into every paged gather -- decode, FA2 prefill (sm_80
and sm_90a) and the Hopper prefill -- without register spills: each kernel's SASS holds the
64-bit atomic min of the report (page_check.cuh), the decode and FA2 kernels the barrier vote
that poisons an item's rows, and no local-memory traffic. Needs nvcc (and cuobjdump for the
SASS), not a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnc
from attnc.codegen.decode_module import render_decode_module
from attnc.codegen.module import render_prefill_module, render_prefill_sm90_module
from attnc.runtime.build import cache, toolchain

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
USAGE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
SASS_FUNC = re.compile(r"Function : (\S+)")
REPORT = re.compile(r"\b(?:RED|ATOM)G?\.E\.MIN\.64\b")
VOTE = re.compile(r"\bBAR\.RED\.OR\b")
LOCAL = re.compile(r"\b(?:LDL|STL)\b")

# (what, render, variant, dtype, head_dim, arch, kernels whose SASS must hold the check)
CASES = [
    ("decode", render_decode_module, "causal", "bfloat16", 128, "80", "decode_kernel"),
    ("decode", render_decode_module, "sliding_window", "float16", 64, "90a", "decode_kernel"),
    ("prefill", render_prefill_module, "causal", "bfloat16", 128, "80", "prefill_fa2_kernel"),
    ("prefill", render_prefill_module, "softcap", "float16", 64, "90a", "prefill_fa2_kernel"),
    ("sm90", render_prefill_sm90_module, "causal", "bfloat16", 128, "90a", "prefill_sm90"),
]


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, next to nvcc, or from the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent / "cuobjdump"] if nvcc else []
    for entry in sys.path:
        candidates += list(Path(entry).glob("nvidia/cu*/bin/cuobjdump"))
    return next((str(c) for c in candidates if c.is_file()), None)


def sass_of(cubin: Path) -> str:
    """cuobjdump's SASS of ``cubin`` (skips the test when cuobjdump is not found)."""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("needs cuobjdump")
    done = subprocess.run(
        [cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True
    )
    return done.stdout


def sass_by_function(sass: str) -> dict[str, str]:
    """SASS text per kernel (mangled name)."""
    parts = SASS_FUNC.split(sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.parametrize(("what", "render", "name", "dtype", "head_dim", "arch", "kernel"), CASES)
def test_page_check_compiles_in_without_spills(
    tmp_path, what, render, name, dtype, head_dim, arch, kernel
):
    ir = attnc.load(f"stdlib:{name}").ir
    source = tmp_path / f"{what}_{name}.cu"
    source.write_text(render(ir, dtype, head_dim))
    lib = tmp_path / f"{what}_{name}.so"
    flags = toolchain.nvcc_flags(arch, (str(cache.INCLUDE_DIR),), ("-Xptxas", "-v"))
    proc = subprocess.run(
        [toolchain.find_nvcc(), *flags, "-o", str(lib), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows, current = [], None
    for line in proc.stderr.splitlines():
        m = ENTRY.search(line)
        if m:
            current = m.group(1)
            continue
        m = USAGE.search(line)
        if m and current is not None:
            rows.append((current, *map(int, m.groups())))
            current = None
    checked = [r for r in rows if kernel in r[0]]
    assert checked, rows
    assert all(r[1:] == (0, 0, 0) for r in rows), rows  # no stack, no spills anywhere

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found: SASS not inspected")
    sass = subprocess.run([tool, "-sass", str(lib)], capture_output=True, text=True, check=True)
    functions = {f: s for f, s in sass_by_function(sass.stdout).items() if kernel in f}
    assert functions, "no SASS for " + kernel
    for func, text in functions.items():
        assert REPORT.search(text), f"{func}: no 64-bit atomic min (page-id report)"
        if what != "sm90":
            assert VOTE.search(text), f"{func}: no barrier vote (poisoned rows)"
        assert not LOCAL.search(text), f"{func}: local memory traffic"
