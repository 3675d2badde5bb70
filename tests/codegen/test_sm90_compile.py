"""The Hopper (sm_90a) prefill template compiles for every stdlib variant without spills, and
its SASS runs on HGMMA with no local memory -- needs nvcc (and cuobjdump for the SASS), not a
GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnc.codegen.functor import emit_functor, struct_name
from attnc.codegen.module import analysed  # the analysis the module emitter uses
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "attnc" / "kernels" / "include"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
SASS_FUNC = re.compile(r"Function : (\S+)")


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


def variant_tu(names: list[str], dtype: str, head_dim: int) -> str:
    """One translation unit instantiating the Hopper launcher for the given stdlib variants."""
    compiled = [c for name in names for c in compile_source(*resolve_source(f"stdlib:{name}"))[0]]
    return launcher_tu(compiled, dtype, head_dim)


def launcher_tu(
    compiled: list,
    dtype: str,
    head_dim: int,
    header: str = "attnc/sm90/prefill_sm90_launcher.cuh",
    launch: str = "attnc::sm90::launch_prefill_sm90",
) -> str:
    """One translation unit instantiating a prefill launcher (default: the Hopper one; the FA2
    one is ``attnc/prefill_launcher.cuh``, ``attnc::launch_prefill``) for compiled variants."""
    parts = [f'#include "{header}"']
    for c in compiled:
        parts.append(emit_functor(analysed(c.variant)))
        sname = struct_name(c.variant)
        parts.append(
            f'extern "C" int launch_{sname}(const AttncPrefillArgs* a, cudaStream_t s) {{\n'
            f"  return {launch}<{sname}, {dtype}, {head_dim}>(*a, s);\n"
            "}"
        )
    return "\n".join(parts) + "\n"


def nvcc_compile(tu: Path, obj: Path) -> str:
    cmd = ["nvcc", "-std=c++17", "-O3", ARCH, f"-I{INCLUDE}", "-Xptxas", "-v", "-c", str(tu)]
    run = subprocess.run([*cmd, "-o", str(obj)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"{' '.join(cmd)}\n{run.stdout}{run.stderr}"
    return run.stdout + run.stderr


def sm90_kernel_resources(
    log: str, kernel: str = "prefill_sm90_kernel"
) -> list[tuple[str, int, int, int]]:
    """(kernel, stack frame, spill stores, spill loads) of every Hopper prefill kernel (or of
    the kernels whose name holds ``kernel``) in a ptxas log."""
    rows, current = [], None
    for line in log.splitlines():
        m = ENTRY.search(line)
        if m:
            current = m.group(1)
            continue
        m = SPILL.search(line)
        if m and current is not None:
            if kernel in current:
                rows.append((current, *map(int, m.groups())))
            current = None
    return rows


def sass_by_function(sass: str) -> dict[str, str]:
    """cuobjdump --dump-sass text split per function."""
    out: dict[str, str] = {}
    name = None
    for line in sass.splitlines():
        m = SASS_FUNC.search(line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


# The light stdlib variants: three consumer warpgroups at head_dim 64 and 128 (a second kernel).
LIGHT = {
    "causal",
    "prefix_lm",
    "sliding_window",
    "softcap",
    "vanilla",
    "per_request_window",
    "gpt_oss_local",  # a sink adds no per-tile work
}
# Masks that read per-token tensors run three consumers at head_dim 128 only (they spill at 64),
# and so does ALiBi's stepped bias, which the QK GEMM computes there (kGemmBiasVariant).
LIGHT_AT_128 = LIGHT | {"doc_causal", "alibi"}

# Two translation units per configuration, compiled in parallel (2 cores is enough).
CONFIGS = [
    ("__nv_bfloat16", 128, None),
    ("half", 64, None),  # two or three consumer warpgroups, by variant
    ("__nv_bfloat16", 256, ["causal", "softcap"]),
]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> list[tuple[str, int, str, Path]]:
    tmp = tmp_path_factory.mktemp("sm90_compile")
    names = stdlib_names()
    jobs = []
    for dtype, head_dim, subset in CONFIGS:
        chosen = subset or names
        halves = [chosen] if len(chosen) < 2 else [chosen[::2], chosen[1::2]]
        for i, part in enumerate(halves):
            tu = tmp / f"sm90_{head_dim}_{i}.cu"
            tu.write_text(variant_tu(part, dtype, head_dim))
            jobs.append((dtype, head_dim, tu, tmp / f"sm90_{head_dim}_{i}.o"))
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        logs = list(pool.map(lambda j: nvcc_compile(j[2], j[3]), jobs))
    return [(d, h, log, obj) for (d, h, _, obj), log in zip(jobs, logs, strict=True)]


def expected_kernels() -> int:
    """Hopper prefill kernels the builds hold: one per variant and configuration, plus the
    light variants' second (three-consumer) kernel at head_dim 64 and 128."""
    one_each = sum(len(s) if s else len(stdlib_names()) for _, _, s in CONFIGS)
    return one_each + len(LIGHT) + len(LIGHT_AT_128)


def test_every_stdlib_variant_compiles_without_spills(builds):
    kernels = [r for _, _, log, _ in builds for r in sm90_kernel_resources(log)]
    expected = expected_kernels()
    assert len(kernels) == expected, kernels
    spilled = [r for r in kernels if r[1] or r[2] or r[3]]
    assert spilled == [], f"Hopper kernels with a stack frame or spills: {spilled}"


def dump_sass(obj: Path) -> dict[str, str]:
    """The SASS of every function in ``obj`` (skips the test without cuobjdump)."""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    env = dict(os.environ)
    env["PATH"] = f"{Path(cuobjdump).parent}{os.pathsep}{env.get('PATH', '')}"
    run = subprocess.run(
        [cuobjdump, "--dump-sass", str(obj)], capture_output=True, text=True, env=env, check=False
    )
    assert run.returncode == 0, run.stderr
    return sass_by_function(run.stdout)


def test_sass_uses_hgmma_and_no_local_memory(builds):
    checked = 0
    for _, _, _, obj in builds:
        for name, body in dump_sass(obj).items():
            if "prefill_sm90_kernel" not in name:
                continue
            checked += 1
            assert "HGMMA" in body, f"{name}: no HGMMA in the SASS"
            assert not re.search(r"\b(LDL|STL)\b", body), f"{name}: local memory (LDL/STL)"
            # exp and sigmoid take the flush-to-zero MUFU forms: no subnormal fix-up code
            assert "-126" not in body, f"{name}: a subnormal fix-up (compare with -126)"
    assert checked == expected_kernels()


def test_light_variants_run_three_consumers(builds):
    """At head_dim 64 and 128 a light variant's module (softmax, and at 64 no stepped bias and
    no per-token mask tensor) holds a kernel of three consumer warpgroups of 160 registers
    (setmaxnreg 0xa0) next to the two-consumer one (216, 0xd8); the others only the latter."""
    counts: dict[tuple[int, str], set[str]] = {}
    for _, head_dim, _, obj in builds:
        for name, body in dump_sass(obj).items():
            if "prefill_sm90_kernel" not in name or head_dim == 256:
                continue
            variant = re.search(r"Variant_([a-z_]+?)(?:\d|$)", name).group(1)  # type: ignore[union-attr]
            alloc = re.search(r"SETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", body)
            counts.setdefault((head_dim, variant), set()).add(alloc.group(1) if alloc else "none")
    for name in stdlib_names():
        for head_dim, light in ((64, LIGHT), (128, LIGHT_AT_128)):
            want = {"0xa0", "0xd8"} if name in light else {"0xd8"}
            assert counts[(head_dim, name)] == want, (name, head_dim, counts)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_split_build_predicts_the_three_consumer_kernel(head_dim):
    """The module renderer's copy of the light-class rule (it builds a module with a
    three-consumer kernel from two sources) answers as the kernels above do."""
    from attnc.codegen.module import sm90_has_three_consumer_kernel

    light = {64: LIGHT, 128: LIGHT_AT_128, 256: set()}[head_dim]
    for name in stdlib_names():
        compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
        got = sm90_has_three_consumer_kernel(compiled[0].variant, head_dim)
        assert got == (name in light), (name, head_dim)


def test_module_of_two_sources_holds_both_kernels(tmp_path, monkeypatch):
    """A light variant's Hopper module, built by the runtime from its two sources, holds the
    two- and three-consumer kernels, exports only the C entries, and its main source names
    the second."""
    from attnc.runtime.build import jit, modules

    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    compiled, _ = compile_source(*resolve_source("stdlib:causal"))
    spec = modules.PREFILL_SM90_MODULES.spec(compiled[0].variant, "bfloat16", 128, "90a")
    assert len(spec.parts) == 1 and "#define ATTNC_SM90_WIDE_ELSEWHERE 1" in spec.source
    assert "ATTNC_DEFINE_PREFILL_SM90_WIDE(Variant_causal, __nv_bfloat16, 128)" in spec.parts[0]
    library = jit.build_modules([spec], arch="90a")[0]
    kernels = [n for n in dump_sass(library) if "prefill_sm90_kernel" in n]
    shapes = sorted(re.search(r"PrefillSm90ShapeILi128ELi(\d)", n).group(1) for n in kernels)  # type: ignore[union-attr]
    assert shapes == ["2", "3"], kernels
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True
    )
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
    assert all(name.startswith("attnc_") for name in exported), exported
    assert "attnc_prefill" in exported and not any("wide" in name for name in exported)


def test_split_build_of_a_variant_without_three_consumers_fails(tmp_path):
    """The renderer's rule is checked by the build: a heavy variant (sigmoid: no softmax)
    rendered as two sources fails at the static_assert that names the macro."""
    from attnc.codegen.module import render_module

    compiled, _ = compile_source(*resolve_source("stdlib:sigmoid"))
    text = render_module(
        "prefill_sm90_module.cu.j2", compiled[0].variant, "bfloat16", 128, wide_elsewhere=True
    )
    tu = tmp_path / "sigmoid_split.cu"
    tu.write_text(text)
    cmd = [
        "nvcc",
        "-std=c++17",
        "-O0",
        ARCH,
        f"-I{INCLUDE}",
        "-c",
        str(tu),
        "-o",
        str(tmp_path / "x.o"),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "ATTNC_SM90_WIDE_ELSEWHERE: this variant has no three-consumer kernel" in (
        run.stdout + run.stderr
    )


def test_keys_per_stage(builds):
    """S tiles of 80 keys (HGMMA 64x80) in the three-consumer kernels at head_dim 128 and in
    causal's kernel at 256 (a light variant with an affine score); 64 keys in soft-cap's at 256
    (its tanh spills with 80); 128 in the two-consumer kernels at 128."""
    shapes: dict[tuple[int, str, str], set[str]] = {}
    for dtype, head_dim, _, obj in builds:
        if dtype != "__nv_bfloat16":
            continue
        for name, body in dump_sass(obj).items():
            if "prefill_sm90_kernel" not in name:
                continue
            variant = re.search(r"Variant_([a-z_]+?)(?:\d|$)", name).group(1)  # type: ignore[union-attr]
            consumers = re.search(r"PrefillSm90ShapeILi\d+ELi(\d)", name).group(1)  # type: ignore[union-attr]
            # S = Q K^T reads both operands from shared memory: "HGMMA.64xNx16... Rd, gdesc[".
            ss = re.findall(r"HGMMA\.64x(\d+)x16\.F32\.BF16 R\d+, gdesc\[", body)
            shapes[(head_dim, variant, consumers)] = set(ss)
    assert shapes[(128, "causal", "3")] == {"80"}, shapes
    assert shapes[(128, "causal", "2")] == {"128"}, shapes
    assert shapes[(256, "causal", "2")] == {"80"}, shapes
    assert shapes[(256, "softcap", "2")] == {"64"}, shapes


def test_alibi_steps_its_bias_per_key_or_in_the_qk_gemm(builds):
    """ALiBi's bias is linear in kv_idx. The two-consumer kernel at head_dim 128 evaluates it
    once per row and tile and steps it per key, an FFMA of the row's step with the key's offset
    from the lane's first key as an immediate (8, 9, 16, ...); a row whose bias or step is not
    finite takes the per-element form instead (one int-to-float conversion per element), which
    is compiled next to it but not run for finite slopes. The three-consumer kernel computes
    the steps in the QK GEMM instead: each S tile takes one more k-step, read from the
    interleaved bias blocks (descriptors without swizzle), so it holds 9 HGMMA.64x80x16 with
    both operands in shared memory where causal's holds 8, and no stepping FFMA."""
    stepped, qk = {}, {}
    offsets = "|".join(str(8 * n + e) for n in range(1, 16) for e in (0, 1))
    step_ffma = re.compile(rf"\bFFMA R\d+, R\d+, ({offsets}), R\d+")
    qk_hgmma = re.compile(r"HGMMA\.64x80x16\.F32\.BF16 R\d+, gdesc\[")
    for dtype, head_dim, _, obj in builds:
        if (dtype, head_dim) != ("__nv_bfloat16", 128):
            continue
        for name, body in dump_sass(obj).items():
            if "prefill_sm90_kernel" not in name:
                continue
            consumers = re.search(r"PrefillSm90ShapeILi\d+ELi(\d)", name).group(1)  # type: ignore[union-attr]
            if "Variant_alibi" in name:
                stepped[consumers] = len(step_ffma.findall(body))
            if consumers == "3" and re.search(r"Variant_(alibi|causal)\d", name):
                qk["alibi" if "alibi" in name else "causal"] = len(qk_hgmma.findall(body))
    assert set(stepped) == {"2", "3"}, stepped
    assert stepped["2"] >= 30 and stepped["3"] == 0, stepped  # one tile's offsets at least
    assert qk["causal"] > 0 and qk["causal"] % 8 == 0, qk
    assert qk["alibi"] * 8 == qk["causal"] * 9, qk


def test_alibi_at_head_dim_64_holds_its_logits_in_units_of_its_step(builds):
    """At head_dim 64 the Hopper kernel keeps ALiBi's logits in units of each row's step: one
    FFMA of the score with the row's multiplier plus the key's offset from the lane's first key
    as an immediate (8, 9, 16, ...), not the step times the offset plus the bias."""
    offsets = "|".join(str(8 * n + e) for n in range(1, 16) for e in (0, 1))
    in_units = re.compile(rf"\bFFMA R\d+, R\d+(?:\.reuse)?, R\d+(?:\.reuse)?, ({offsets}) ;")
    stepped = re.compile(rf"\bFFMA R\d+, R\d+, ({offsets}), R\d+")
    counts = {}
    for dtype, head_dim, _, obj in builds:
        if (dtype, head_dim) != ("half", 64):
            continue
        for name, body in dump_sass(obj).items():
            if "prefill_sm90_kernel" in name and "Variant_alibi" in name:
                counts[name] = (len(in_units.findall(body)), len(stepped.findall(body)))
    assert len(counts) == 1, counts
    units, steps = next(iter(counts.values()))
    assert units >= 30 and steps == 0, counts  # one tile's offsets at least


def test_module_template_renders_the_sm90_launcher():
    from attnc.codegen.module import render_prefill_sm90_module

    compiled, _ = compile_source(*resolve_source("stdlib:softcap"))
    text = render_prefill_sm90_module(compiled[0].variant, "bfloat16", 128)
    assert '#include "attnc/sm90/prefill_sm90_launcher.cuh"' in text
    assert "ATTNC_DEFINE_PREFILL_SM90_MODULE(Variant_softcap, __nv_bfloat16, 128)" in text


@pytest.mark.parametrize("head_dim", [128, 64])
def test_module_host_side(tmp_path, head_dim):
    """ABI version, tile_q_tokens answers and argument errors of a Hopper module, on the CPU
    (a light variant's tile has 192 rows: three consumer warpgroups)."""
    cmd = [
        "nvcc", "-std=c++17", "-O1", ARCH, f"-I{INCLUDE}", f"-I{FIXTURES}",
        "-DATTNC_FIXTURE=Causal", "-DATTNC_DTYPE=__nv_bfloat16", f"-DATTNC_HEAD_DIM={head_dim}",
        str(FIXTURES / "prefill_sm90_module.cu"), str(FIXTURES / "host_checks_sm90.cu"),
        "-o", str(tmp_path / "host_checks_sm90"),
    ]  # fmt: skip
    build = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert build.returncode == 0, f"{' '.join(cmd)}\n{build.stdout}{build.stderr}"
    run = subprocess.run([str(tmp_path / "host_checks_sm90")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr


def test_a_light_user_variant_can_spill_with_three_consumers(tmp_path):
    """The premise of the launcher's fallback (three_consumers_serve): a user variant in the
    light class, scores gated by their own sigmoid, keeps 32 bytes of stack with three
    consumers at head_dim 64 and none with two; its module then answers two consumers' tile
    on a GPU (tests/gpu/test_prefill_sm90.py)."""
    from spilling_variant import SOURCE

    compiled, _ = compile_source(SOURCE, "silu_score.attn")
    name = struct_name(compiled[0].variant)
    tu = tmp_path / "silu_score.cu"
    tu.write_text(
        '#include "attnc/sm90/prefill_sm90_launcher.cuh"\n'
        + emit_functor(analysed(compiled[0].variant))
        + f"\nATTNC_DEFINE_PREFILL_SM90_MODULE({name}, half, 64)\n"
    )
    log = nvcc_compile(tu, tmp_path / "silu_score.o")
    frames = {r[0]: r[1] for r in sm90_kernel_resources(log)}
    three = [f for k, f in frames.items() if "PrefillSm90ShapeILi64ELi3" in k]
    two = [f for k, f in frames.items() if "PrefillSm90ShapeILi64ELi2" in k]
    assert len(three) == 1 and len(two) == 1, frames
    assert three[0] > 0 and two[0] == 0, frames
