"""The FA2 prefill template compiles for sm_80 and sm_90a without spills, and its host side
behaves (tile table, argument errors, fixture tile bounds) -- needs nvcc, not a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "attnc" / "kernels" / "include"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90a,code=sm_90a",
]
FIXTURE_NAMES = ["Causal", "SoftCap", "Alibi", "SlidingWindow", "Sigmoid", "Vanilla"]
SHAPES_PER_HEAD_DIM = {64: 3, 128: 3, 256: 2}  # distinct tile shapes a module instantiates

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def nvcc(args: list[str], cwd: Path) -> subprocess.Popen:
    cmd = ["nvcc", "-std=c++17", f"-I{INCLUDE}", f"-I{FIXTURES}", *args]
    return subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate()
    assert proc.returncode == 0, f"{' '.join(proc.args)}\n{out}"
    return out


def kernel_resources(ptxas_log: str) -> list[tuple[str, str, int, int, int]]:
    """(kernel, arch, stack frame, spill stores, spill loads) of every prefill kernel."""
    rows, current = [], None
    for line in ptxas_log.splitlines():
        m = ENTRY.search(line)
        if m:
            current = (m.group(1), m.group(2))
            continue
        m = SPILL.search(line)
        if m and current is not None:
            if "prefill_fa2_kernel" in current[0]:
                rows.append((*current, *map(int, m.groups())))
            current = None
    return rows


def all_fixtures_tu() -> str:
    """One translation unit holding every fixture at head_dim 128, bf16."""
    lines = ['#include "attnc/prefill_launcher.cuh"', '#include "variants.cuh"', ""]
    for name in FIXTURE_NAMES:
        lines.append(
            f'extern "C" int launch_{name}(const AttncPrefillArgs* a, cudaStream_t s) {{\n'
            f"  return attnc::launch_prefill<attnc_fixtures::{name}, __nv_bfloat16, 128>(*a, s);\n"
            "}"
        )
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ptxas_logs(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("prefill_compile")
    (tmp / "all_fixtures.cu").write_text(all_fixtures_tu())
    common = ["-O3", *ARCH_FLAGS, "-Xptxas", "-v", "-c"]
    module = str(FIXTURES / "prefill_module.cu")
    jobs = {
        "all_bf16_128": nvcc([*common, "all_fixtures.cu", "-o", "all.o"], tmp),
        "causal_fp16_64": nvcc(
            [
                *common,
                "-DATTNC_FIXTURE=Causal",
                "-DATTNC_DTYPE=half",
                "-DATTNC_HEAD_DIM=64",
                module,
                "-o",
                "c64.o",
            ],
            tmp,
        ),
    }
    logs = {"all_bf16_128": finish(jobs.pop("all_bf16_128"))}
    jobs["causal_fp16_256"] = nvcc(
        [
            *common,
            "-DATTNC_FIXTURE=Causal",
            "-DATTNC_DTYPE=half",
            "-DATTNC_HEAD_DIM=256",
            module,
            "-o",
            "c256.o",
        ],
        tmp,
    )
    for key, proc in jobs.items():
        logs[key] = finish(proc)
    return logs


@pytest.mark.parametrize(
    "key, kernels_per_arch",
    [
        ("all_bf16_128", len(FIXTURE_NAMES) * SHAPES_PER_HEAD_DIM[128]),
        ("causal_fp16_64", SHAPES_PER_HEAD_DIM[64]),
        ("causal_fp16_256", SHAPES_PER_HEAD_DIM[256]),
    ],
)
def test_prefill_kernels_compile_without_spills(ptxas_logs, key, kernels_per_arch):
    rows = kernel_resources(ptxas_logs[key])
    for arch in ("sm_80", "sm_90a"):
        assert len([r for r in rows if r[1] == arch]) == kernels_per_arch, (arch, rows)
    spilled = [r for r in rows if r[2] or r[3] or r[4]]
    assert spilled == [], f"kernels with a stack frame or spills: {spilled}"


def test_prefill_ptx_uses_tensor_core_path(tmp_path):
    """The kernel is built from mma.sync, ldmatrix (plain and transposed), cp.async and ex2."""
    proc = nvcc(
        [
            "-O3",
            "-gencode=arch=compute_90a,code=compute_90a",
            "-ptx",
            "-DATTNC_FIXTURE=SoftCap",
            "-DATTNC_DTYPE=__nv_bfloat16",
            "-DATTNC_HEAD_DIM=128",
            str(FIXTURES / "prefill_module.cu"),
            "-o",
            "module.ptx",
        ],
        tmp_path,
    )
    finish(proc)
    ptx = (tmp_path / "module.ptx").read_text()
    for instr in (
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.wait_group",
        "ex2.approx.ftz.f32",
        "tanh.approx.f32",
    ):
        assert instr in ptx, instr
    assert ".local" not in ptx, "the kernel uses local memory"


def test_module_host_side(tmp_path):
    """Tile table, argument errors, and fixture kv_range/classify vs brute force."""
    proc = nvcc(
        [
            "-O1",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-DATTNC_FIXTURE=Causal",
            "-DATTNC_DTYPE=__nv_bfloat16",
            "-DATTNC_HEAD_DIM=128",
            str(FIXTURES / "prefill_module.cu"),
            str(FIXTURES / "host_checks.cu"),
            "-o",
            "host_checks",
        ],
        tmp_path,
    )
    finish(proc)
    run = subprocess.run([str(tmp_path / "host_checks")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr


def test_gpu_harness_compiles(tmp_path):
    harness = ROOT / "tests" / "gpu" / "kernel_harness" / "prefill_harness.cu"
    finish(
        nvcc(
            [
                "-O2",
                "-gencode=arch=compute_90a,code=sm_90a",
                str(harness),
                "-o",
                "prefill_harness",
                "-ldl",
            ],
            tmp_path,
        )
    )
    assert (tmp_path / "prefill_harness").exists()


def test_hopper_tile_shapes_compile_without_spills(tmp_path):
    """The shapes the runtime builds for sm_90 (modules.prefill_arch_flags) do not spill."""
    from attnc.runtime.build.modules import prefill_arch_flags

    tune = list(prefill_arch_flags("90a"))
    assert tune, "sm_90 modules use their own tile shapes"
    (tmp_path / "all_fixtures.cu").write_text(all_fixtures_tu())
    common = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", *tune, "-Xptxas", "-v", "-c"]
    module = str(FIXTURES / "prefill_module.cu")
    d64 = ["-DATTNC_FIXTURE=Causal", "-DATTNC_DTYPE=half", "-DATTNC_HEAD_DIM=64"]
    jobs = [
        nvcc([*common, "all_fixtures.cu", "-o", "all.o"], tmp_path),
        nvcc([*common, *d64, module, "-o", "c64.o"], tmp_path),
    ]
    rows = [r for proc in jobs for r in kernel_resources(finish(proc))]
    assert len(rows) == len(FIXTURE_NAMES) * SHAPES_PER_HEAD_DIM[128] + SHAPES_PER_HEAD_DIM[64]
    spilled = [r for r in rows if r[2] or r[3] or r[4]]
    assert spilled == [], f"kernels with a stack frame or spills: {spilled}"
