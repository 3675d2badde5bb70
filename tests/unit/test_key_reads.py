"""Which tensor reads a kernel may prefetch per key (``key_reads``, ``V::touch_key_reads``):
those of the score and mask whose indices use kv_idx and no row value, so that every query
row reads the same element at a key."""

from __future__ import annotations

import pytest

from attnc.codegen.functor import MAX_KEY_READS, emit_functor, key_reads
from attnc.compiler.ir_printer import format_ir
from attnc.compiler.pipeline import compile_source


def _reads(body: str, params: str = "param t: tensor<f32>[64];") -> list[str]:
    (compiled,), _ = compile_source(f"variant v {{ {params} {body} }}", "k.attn")
    return [format_ir(n) for n in key_reads(compiled.variant)]


@pytest.mark.parametrize(
    "body, expected",
    [("score = score + t[kv_idx];", ["t[kv_idx]"]),
     ("score = score + t[min(kv_idx, 63)];", ["t[min(kv_idx, 63)]"]),
     ("score = score + t[q_pos - kv_idx];", []),  # a row value: per element
     ("score = score + t[qo_head];", []),  # no key
     ("score = score + t[(kv_idx + int(score)) % 64];", []),  # the score varies by row
     ("score = score + t[(kv_idx + kv_len) % 64];", ["t[(kv_idx + kv_len) % 64]"]),
     ("score = score * t[kv_idx % 64] + t[kv_idx % 64];", ["t[kv_idx % 64]"]),  # once
     ("mask = t[kv_idx] > 0.0 && kv_idx <= q_pos;", ["t[kv_idx]"])],
)  # fmt: skip
def test_reads_by_key_alone(body, expected) -> None:
    assert _reads(body) == expected


def test_the_document_mask_reads_its_keys_ids() -> None:
    params = "param doc: tensor<i32>[kv_len];"
    assert _reads("mask = doc[kv_idx] == doc[q_pos];", params) == ["doc[kv_idx]"]


def test_too_many_key_reads_are_not_prefetched() -> None:
    terms = " + ".join(f"t[(kv_idx + {i}) % 64]" for i in range(MAX_KEY_READS + 1))
    assert _reads(f"score = score + {terms};") == []


def test_the_functor_prefetches_each_read_bounds_checked() -> None:
    (compiled,), _ = compile_source(
        "variant v { param t: tensor<f32>[64]; score = score + t[kv_idx]; }", "k.attn"
    )
    text = emit_functor(compiled)
    assert "static constexpr bool kTouchKeyReads = true;" in text
    assert "attnc::vm::prefetch_l1_(attnc::vm::address_in_shape_(p.p_t, 0, kv_idx, 64));" in text
