"""The language-v2 kernel paths cost nothing when a variant does not use them: a functor that
declares `kHasSink = false` / `kMaskReadsTokens = false` / `kBiasStep = false` (and a `sink()`
returning -inf, a `score_bias_step()` returning 0) compiles to the same SASS as the same
functor without those members, for the FA2 prefill (sm_80), the Hopper prefill (sm_90a) and
the decode (sm_80) modules -- so sinks, tile maps and bias steps are compiled out, not
branched around. Needs nvcc and cuobjdump, not a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attnc
from attnc.codegen.decode_module import render_decode_module
from attnc.codegen.module import render_prefill_module, render_prefill_sm90_module

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "attnc" / "kernels" / "include"
SINK_METHOD = re.compile(r"\n  // The row's extra softmax logit.*?\n  }\n", re.S)
STEP_METHOD = re.compile(r"\n  // With kBiasStep, d score_bias.*?\n  }\n", re.S)


def _cuobjdump() -> str | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_sm90_compile import find_cuobjdump

    return find_cuobjdump()


def _without_optional_members(source: str) -> str:
    """The module source with the functor's kHasSink, kMaskReadsTokens, kBiasStep, sink() and
    score_bias_step() removed."""
    out = source.replace("  static constexpr bool kHasSink = false;\n", "")
    out = out.replace("  static constexpr bool kMaskReadsTokens = false;\n", "")
    out = out.replace("  static constexpr bool kBiasStep = false;\n", "")
    out, n = SINK_METHOD.subn("\n", out)
    out, m = STEP_METHOD.subn("\n", out)
    assert n == 1 and out.count("kHasSink") == 0 and "kMaskReadsTokens" not in out
    assert m == 1 and "kBiasStep" not in out and "score_bias_step" not in out
    return out


def _sass(source: str, arch: str, tmp: Path, tag: str, cuobjdump: str) -> str:
    cu, cubin = tmp / f"{tag}.cu", tmp / f"{tag}.cubin"
    cu.write_text(source)
    cmd = ["nvcc", "-std=c++17", "-O3", "-cubin", "--expt-relaxed-constexpr",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{INCLUDE}", str(cu), "-o",
           str(cubin)]  # fmt: skip
    build = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert build.returncode == 0, f"{' '.join(cmd)}\n{build.stderr}"
    dump = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert dump.returncode == 0, dump.stderr
    # Instruction text only: no addresses or encodings.
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", x).strip()
             for x in dump.stdout.splitlines()]  # fmt: skip
    return "\n".join(x for x in lines if x)


@pytest.mark.parametrize("name", ["causal"])
def test_sink_and_tile_map_paths_compile_out(tmp_path, name):
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    ir = attnc.load(f"stdlib:{name}").ir
    modules = [
        ("fa2", "80", render_prefill_module(ir, "bfloat16", 128)),
        ("sm90", "90a", render_prefill_sm90_module(ir, "bfloat16", 128)),
        ("decode", "80", render_decode_module(ir, "bfloat16", 128)),
    ]
    assert all("kHasSink = false" in src for _, _, src in modules)
    jobs = []
    for kind, arch, src in modules:
        jobs.append((src, arch, f"{kind}_declared"))
        jobs.append((_without_optional_members(src), arch, f"{kind}_absent"))
    with ThreadPoolExecutor(2) as pool:
        sass = list(pool.map(lambda j: _sass(j[0], j[1], tmp_path, j[2], cuobjdump), jobs))
    for (kind, _, _), declared, absent in zip(modules, sass[::2], sass[1::2], strict=True):
        assert declared == absent, f"{kind}: the SASS depends on the unused optional members"
        assert not re.search(r"\b(LDL|STL)\b", declared), f"{kind}: local memory"
