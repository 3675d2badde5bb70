"""The generated modules of the language-v2 variants (sinks, per-token and per-request
tensors) compile: FA2 prefill for sm_80 and sm_90a, Hopper prefill for sm_90a and decode
for sm_80, without spills -- needs nvcc, not a GPU. Also checks the functor text the kernels
rely on (the contract's spellings of the new reads and flags)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import attnc
from attnc.codegen.decode_module import render_decode_module
from attnc.codegen.module import render_prefill_module, render_prefill_sm90_module

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "attnc" / "kernels" / "include"
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
Q_LEN_SPEC = """\
variant query_bonus {
    param bonus: tensor<f32>[q_len];
    param sinks: tensor<f32>[num_qo_heads];
    score = score + bonus[q_idx];
    sink = sinks[qo_head] + bonus[q_idx];
    mask = kv_idx <= q_pos;
}
"""
VARIANTS = ["stdlib:doc_causal", "stdlib:per_request_window", "stdlib:gpt_oss_local", Q_LEN_SPEC]
IDS = ["doc_causal", "per_request_window", "gpt_oss_local", "query_bonus"]
BUILDS = [
    ("fa2", render_prefill_module, ["80", "90a"]),
    ("sm90", render_prefill_sm90_module, ["90a"]),
    ("decode", render_decode_module, ["80"]),
]


def functor(spec: str) -> str:
    return attnc.load(spec).cuda_source


def test_functor_spells_the_contract() -> None:
    doc = functor("stdlib:doc_causal")
    assert "static constexpr bool kMaskReadsTokens = true;" in doc
    assert "static constexpr bool kHasSink = false;" in doc
    assert "p.p_doc[r.kv_start + kv_idx]" in doc
    assert "(row.q_pos >= 0 ? p.p_doc[r.kv_start + row.q_pos] : 0)" in doc
    assert "found == attnc::TileClass::kFull ? attnc::TileClass::kPartial : found" in doc
    window = functor("stdlib:per_request_window")
    assert "static constexpr bool kMaskReadsTokens = false;" in window
    assert "c0 = p.p_window[r.batch];" in window  # read once per request, not per element
    assert "row.h0 = (row.q_pos >= 0 ? p.p_doc[r.kv_start + row.q_pos] : 0);" in doc
    local = functor("stdlib:gpt_oss_local")
    assert "static constexpr bool kHasSink = true;" in local
    assert re.search(r"float sink\(const Row& row\) const \{\n\s+return p\.p_sinks\[", local)
    bonus = functor(Q_LEN_SPEC)
    assert "row.h0 = p.p_bonus[r.q_start + q_idx];" in bonus  # hoisted to the row
    assert "static constexpr bool kMaskReadsTokens = false;" in bonus  # only the score reads it
    plain = functor("stdlib:causal")
    assert "static constexpr bool kHasSink = false;" in plain and "return -INFINITY;" in plain


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("spec", VARIANTS, ids=IDS)
def test_modules_compile_without_spills(spec: str, tmp_path: Path) -> None:
    variant = attnc.load(spec)
    procs = []
    for kind, render, arches in BUILDS:
        source = tmp_path / f"{kind}.cu"
        source.write_text(render(variant.ir, "bfloat16", 128), encoding="utf-8")
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in arches]
        cmd = ["nvcc", "-std=c++17", f"-I{INCLUDE}", "-c", str(source), "-o", str(source) + ".o"]
        cmd += [*gencode, "-Xptxas", "-v"]
        procs.append(
            (
                kind,
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            )
        )
    for kind, proc in procs:
        out, _ = proc.communicate()
        assert proc.returncode == 0, f"{kind} module of {variant.name} failed:\n{out[-4000:]}"
        spills = [m.groups() for m in SPILL.finditer(out)]
        assert spills, f"{kind}: no ptxas resource lines"
        assert all(int(st) == 0 and int(ld) == 0 for _, st, ld in spills), f"{kind} spills:\n{out}"
