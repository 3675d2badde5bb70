"""Key values staged by the FA2 prefill kernel (prefill_mainloop.cuh), compiled without a
GPU: a variant whose score reads key values, with up to two fields of ``V::KeyValues``, gets
kernels that write each tile's values into shared memory (``STS``) and read a lane's pair of
keys as one vector (``LDS.64``/``LDS.128``), in every tile shape at head_dim 64, 128 and 256,
for sm_80 and for sm_90a with its shapes (``ATTNC_PREFILL_TUNE=1``: stages of two S tiles).
Four fields and eight (staged, they spilled 56 to 168 bytes at d=64), a mask alone
(documents: evaluated on PARTIAL tiles only, where staging did not pay) and a variant without
key values stage nothing. No kernel spills on sm_80; on sm_90a only the d=128 shape of two
32-key S tiles does, where the kernel of a causal mask without key values already has 16
bytes of stack: a staged one has no more."""

from __future__ import annotations

import re
import subprocess

import pytest
from test_sm90_compile import INCLUDE, dump_sass, launcher_tu, sm90_kernel_resources
from test_sm90_compile import pytestmark as compile_marks

from attnc.compiler.pipeline import compile_source

pytestmark = compile_marks  # nvcc, skipped without it

EIGHT_TERMS = " && ".join(f"t[(kv_idx + {i}) % 64] > -2.0" for i in range(8))
THREE_TERMS = " && ".join(f"t[(kv_idx + {i}) % 64] > -2.0" for i in range(1, 4))
SOURCE = f"""
variant no_read {{
    mask = kv_idx <= q_pos;
}}
variant one_read {{
    param t: tensor<f32>[kv_len];
    score = score - log(1.0 + abs(t[kv_idx]));
    mask = kv_idx <= q_pos;
}}
variant four_terms {{
    param t: tensor<f32>[64];
    score = score + t[kv_idx % 64];
    mask = kv_idx <= q_pos && {THREE_TERMS};
}}
variant doc {{
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}}
variant doc_and_bias {{
    param doc: tensor<i32>[kv_len];
    param bias: tensor<f32>[kv_len];
    score = score + bias[kv_idx];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}}
variant eight_terms {{
    param t: tensor<f32>[64];
    mask = kv_idx <= q_pos && {EIGHT_TERMS};
}}
"""
TARGETS = {
    "sm_80": ["-gencode=arch=compute_80,code=sm_80"],
    "sm_90a": ["-gencode=arch=compute_90a,code=sm_90a", "-DATTNC_PREFILL_TUNE=1"],
}
HEAD_DIMS = (64, 128, 256)
VECTOR_PAIR = re.compile(r"\bLDS\.(64|128)\b")


def _tu(head_dim: int) -> str:
    compiled, _ = compile_source(SOURCE, "fa2_staged.attn")
    return launcher_tu(
        compiled, "__nv_bfloat16", head_dim, "attnc/prefill_launcher.cuh", "attnc::launch_prefill"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, int], tuple[str, object]]:
    """(target, head_dim) -> (ptxas log, object path), compiled in parallel."""
    tmp = tmp_path_factory.mktemp("fa2_staged")
    procs = {}
    for d in HEAD_DIMS:
        (tmp / f"d{d}.cu").write_text(_tu(d))
        for target, flags in TARGETS.items():
            obj = tmp / f"{target}_d{d}.o"
            cmd = ["nvcc", "-std=c++17", "-O3", *flags, f"-I{INCLUDE}", "-Xptxas", "-v", "-c"]
            procs[(target, d)] = (
                subprocess.Popen(
                    [*cmd, str(tmp / f"d{d}.cu"), "-o", str(obj)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
                obj,
            )
    out = {}
    for key, (proc, obj) in procs.items():
        log, _ = proc.communicate()
        assert proc.returncode == 0, log
        out[key] = (log, obj)
    return out


def _fa2_resources(log: str) -> dict[str, tuple[int, ...]]:
    return {r[0]: r[1:] for r in sm90_kernel_resources(log, "prefill_fa2_kernel")}


STAGED = ("one_read", "doc_and_bias")  # the score reads them, up to 8 bytes a key


def _at_the_edge(target: str, d: int, kernel: str) -> bool:
    """The sm_90a d=128 shape of 64-key stages as two S tiles (four warps, two m16 tiles)."""
    return target == "sm_90a" and d == 128 and "PrefillTileILi128ELi4ELi2ELi64ELi2" in kernel


def test_fa2_kernels_do_not_spill(built):
    for (target, d), (log, _) in built.items():
        rows = _fa2_resources(log)
        assert len(rows) == 6 * (2 if d == 256 else 3), (target, d, sorted(rows))
        for name, (stack, stores, loads) in rows.items():
            if not _at_the_edge(target, d, name):
                assert (stack, stores, loads) == (0, 0, 0), (target, d, name)
            elif any(f"Variant_{v}" in name for v in STAGED):
                assert stack <= 16, (target, d, name, stack)


@pytest.mark.parametrize("target", list(TARGETS))
def test_fa2_kernels_stage_up_to_four_fields(built, target):
    for d in HEAD_DIMS:
        _, obj = built[(target, d)]
        kernels = {n: b for n, b in dump_sass(obj).items() if "prefill_fa2_kernel" in n}
        assert len(kernels) == 6 * (2 if d == 256 else 3)
        for name, body in kernels.items():
            staged = any(f"Variant_{v}" in name for v in STAGED)
            assert bool(re.search(r"\bSTS\b", body)) == staged, (target, d, name)
            assert bool(VECTOR_PAIR.search(body)) == staged, (target, d, name)
