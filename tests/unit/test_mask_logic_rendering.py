"""How the functor spells ``&&`` and ``||`` in masks: both sides are evaluated (``&``/``|``)
when the right side reads only per-token or per-request tensors (their reads stay inside
the request by the index rule, and the kernels then load a tile's values together instead
of one branch and one load latency per element); any other right side keeps the
short-circuit, which may guard a read the user bounded by hand."""

from __future__ import annotations

from attnc.codegen.stages import emit_stage
from attnc.compiler.pipeline import compile_source


def _mask_line(source: str) -> str:
    compiled, _ = compile_source(source, "<test>")
    _, text = emit_stage(compiled[0], "cuda")
    start = text.index("bool mask(")
    return text[start : text.index("}", start)]


def test_token_read_on_the_right_evaluates_both_sides() -> None:
    line = _mask_line(
        """variant d {
            param doc: tensor<i32>[kv_len];
            mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
        }"""
    )
    assert "&&" not in line
    assert "bool((kv_idx <= row.q_pos) & (p.p_doc[r.kv_start + kv_idx] == row.h0))" in line


def test_or_with_a_token_read_evaluates_both_sides() -> None:
    line = _mask_line(
        """variant d {
            param doc: tensor<i32>[kv_len];
            mask = kv_idx < 4 || doc[kv_idx] == doc[q_pos];
        }"""
    )
    assert "||" not in line and " | " in line


def test_literal_shaped_read_keeps_the_short_circuit() -> None:
    line = _mask_line(
        """variant t {
            param table: tensor<i32>[16];
            mask = kv_idx < 16 && table[kv_idx] > 0;
        }"""
    )
    assert "&&" in line


def test_mask_without_reads_keeps_the_short_circuit() -> None:
    line = _mask_line(
        """variant w {
            param window: i32 = 128;
            mask = kv_idx <= q_pos && q_pos - kv_idx < window;
        }"""
    )
    assert "&&" in line


def test_a_guarded_i32_division_of_row_values_is_hoisted_to_the_row() -> None:
    # chunked_local's `q_pos / chunk` on the right of && was divided per element: the hoister
    # kept every guarded i32 / and % in place, although idiv_ is total (x / 0 == 0). It is
    # now a Row field, and the element divides only kv_idx.
    line = _mask_line(
        """variant c {
            param chunk: i32 = 4;
            mask = kv_idx <= q_pos && kv_idx / chunk == q_pos / chunk;
        }"""
    )
    assert "idiv_(row.q_pos" not in line
    assert "(attnc::vm::idiv_(kv_idx, p.p_chunk) == row.h0)" in line
