"""Bounds-checked reads (compiler/index_range.py) in the host harness: reads whose indices are
not proven inside their dims give 0 outside the shape in the generated functor
(``attnc::vm::load_in_shape_``) as in the PyTorch reference, in the score, the mask and the
sink."""

from __future__ import annotations

import pytest
from host_fixture import HARNESS_MARKS

from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

pytestmark = HARNESS_MARKS

# The harness draws i32 params up to twice the longest length and t has num_qo_heads (1 to
# 16) entries, so t[w], t[kv_idx] and t[q_pos - kv_idx] fall outside t at many points. Each
# case depends on the value read outside (a fill of 1 instead of 0 in the reference fails
# every one of them).
UNPROVEN = {
    "score": "score = score + t[kv_idx] + t[w] * 0.5 + t[q_pos - kv_idx] * 0.25;",
    "guard": "score = kv_idx >= 2 ? score + t[kv_idx] : score - t[w % 7];",
    "mask": "mask = kv_idx <= q_pos && t[kv_idx] < 0.5;",
    "sink": "sink = t[w] + t[q_idx];",
    "key_table": "score = score + t[idx[kv_idx]];",
}


def _source(body: str) -> str:
    return (
        "variant unproven {\n    param t: tensor<f32>[num_qo_heads];\n"
        "    param idx: tensor<i32>[num_kv_heads];\n    param w: i32 = 0;\n"
        f"    {body}\n    score = score + float(w) * 0.0 + float(idx[0]);\n}}\n"
    )


@pytest.mark.parametrize("name", list(UNPROVEN))
def test_unproven_reads_agree_with_the_reference(name: str) -> None:
    compiled, warnings = compile_source(_source(UNPROVEN[name]), "u.attn")
    assert any("may fall outside its dim" in w.message for w in warnings)
    assert "load_in_shape_(p.p_t" in emit_functor(compiled[0])
    report = run_host_test(compiled[0], points=2000, seed=7)
    assert report.ok, report.summary()


# A read that a guard keeps inside its dim, in a mask whose tile ranges take it as an atom.
GUARDED_ATOMS = {
    "and": "mask = p >= 0 && p < 4 && kv_idx <= t4[p];",
    "or": "mask = p < 0 || p >= 4 || kv_idx <= q_pos + t4[p];",
    "nested": "mask = p >= 0 && p < 4 && kv_idx <= t4[t4[p] % 4];",
}


@pytest.mark.parametrize("name", list(GUARDED_ATOMS))
@pytest.mark.parametrize("p", [10**9, -(10**8), 2])
def test_tile_ranges_read_guarded_atoms_checked(name: str, p: int) -> None:
    """The element mask read t4[p] under its guard, but kv_range, classify and row_kv_range
    read it plainly (the analysis's atoms carry no guard): the harness segfaulted at
    p = 10**9, and the kernels would have read far outside t4."""
    body = GUARDED_ATOMS[name]
    source = f"variant g {{\n    param t4: tensor<i32>[4];\n    param p: i32;\n    {body}\n}}\n"
    compiled, _ = compile_source(source, "g.attn")
    text = emit_functor(compiled[0])
    assert "p.p_t4[p.p_p]" in text  # the element mask, behind its guard
    assert "load_in_shape_(p.p_t4, 0, p.p_p, 4)" in text  # the tile ranges
    report = run_host_test(compiled[0], points=500, seed=3, fixed_params={"p": p})
    assert report.ok, report.summary()
