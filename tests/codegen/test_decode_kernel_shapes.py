"""Every decode tile shape (16 and 32 packed rows, head_dim 64/128/256) runs on the one decode
pipeline and compiles for sm_80 and sm_90a without a stack frame, spills or local-memory
instructions (LDL/STL in the SASS, checked where cuobjdump is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnc.codegen.decode_module import render_decode_module
from attnc.compiler.pipeline import compile_source
from attnc.compiler.sources import resolve_source

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

INCLUDE = Path(__file__).resolve().parents[2] / "attnc" / "kernels" / "include"
ARCHS = ("80", "90a")
# (variant, dtype, head_dim): every tile shape, softmax and not, mask and not, hoisted rows.
# sliding_window at d=64: its 32-row tile spilled in the former per-item pipeline.
CASES = [
    ("softcap", "bfloat16", 256),
    ("alibi", "float16", 128),
    ("sigmoid", "bfloat16", 64),
    ("sliding_window", "float16", 256),
    ("sliding_window", "bfloat16", 64),
]
ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
USAGE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent / "cuobjdump"] if nvcc else []
    for entry in sys.path:  # the nvidia-cuda-cuobjdump wheel of the dev extras
        candidates += list(Path(entry).glob("nvidia/cu*/bin/cuobjdump"))
    return next((str(c) for c in candidates if c.is_file()), None)


def decode_resources(log: str) -> list[tuple[str, str, int, int, int]]:
    """(kernel, arch, stack frame, spill stores, spill loads) of every decode_kernel."""
    rows, current = [], None
    for line in log.splitlines():
        m = ENTRY.search(line)
        if m:
            current = (m.group(1), m.group(2))
            continue
        m = USAGE.search(line)
        if m and current is not None:
            if "decode_kernel" in current[0]:
                rows.append((*current, *map(int, m.groups())))
            current = None
    return rows


def local_memory_instructions(sass: str) -> dict[str, int]:
    """LDL/STL count per function of a cuobjdump --dump-sass listing."""
    counts: dict[str, int] = {}
    function = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            function = m.group(1)
            counts[function] = 0
        elif function and re.search(r"\b(?:LDL|STL)\b", line):
            counts[function] += 1
    return counts


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[tuple[str, str, int], tuple[str, Path]]:
    """ptxas log and object file of each case, compiled in parallel."""
    tmp = tmp_path_factory.mktemp("decode_shapes")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    procs = {}
    for name, dtype, head_dim in CASES:
        text, file = resolve_source(f"stdlib:{name}")
        compiled, _ = compile_source(text, file)
        stem = f"{name}_{dtype}_{head_dim}"
        source = tmp / f"{stem}.cu"
        source.write_text(render_decode_module(compiled[0].variant, dtype, head_dim))
        cmd = ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", *gencode]
        cmd += [f"-I{INCLUDE}", "-Xptxas", "-v", "-c", "-o", str(tmp / f"{stem}.o"), str(source)]
        procs[(name, dtype, head_dim)] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for key, proc in procs.items():
        log, _ = proc.communicate()
        assert proc.returncode == 0, log
        out[key] = (log, tmp / f"{key[0]}_{key[1]}_{key[2]}.o")
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_decode_shapes_compile_without_spills(builds, case):
    log, _ = builds[case]
    rows = decode_resources(log)
    shapes = 2 if case[2] <= 128 else 1  # 16 and 32 rows; 16 only at d=256
    for arch in ARCHS:
        assert len([r for r in rows if r[1] == f"sm_{arch}"]) == shapes, rows
    assert not any("Legacy" in r[0] for r in rows), rows
    spilled = [r for r in rows if r[2] or r[3] or r[4]]
    assert spilled == [], f"decode kernels with a stack frame or spills: {spilled}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_decode_sass_has_no_local_memory(builds, case):
    tool = cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found")
    _, obj = builds[case]
    proc = subprocess.run([tool, "--dump-sass", str(obj)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cuobjdump cannot disassemble here: {proc.stderr.strip()[:200]}")
    counts = local_memory_instructions(proc.stdout)
    decode = {f: n for f, n in counts.items() if "decode_kernel" in f}
    assert decode, "no decode kernel in the SASS"
    assert all(n == 0 for n in decode.values()), decode
    assert "HMMA" in proc.stdout
