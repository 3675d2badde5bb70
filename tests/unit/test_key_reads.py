"""Which tensor reads a kernel may prefetch or stage per key (``key_reads``,
``V::touch_key_reads``, ``V::KeyValues``): those of the score and mask whose indices use kv_idx
and no row value, so that every query row reads the same element at a key; and the functor's
``key_values`` and ``*_at`` hooks that take those values instead of reading."""

from __future__ import annotations

import pytest

from attnc.codegen.functor import emit_functor
from attnc.codegen.key_values import MAX_KEY_READS, key_reads
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


def _functor(source: str) -> str:
    (compiled,), _ = compile_source(source, "k.attn")
    return emit_functor(compiled)


def test_key_values_hold_each_read_and_the_at_hooks_read_none() -> None:
    text = _functor(
        "variant v { param doc: tensor<i32>[kv_len]; param t: tensor<f32>[64];"
        " score = score + t[kv_idx % 64]; mask = doc[kv_idx] == doc[q_pos]; }"
    )
    assert "static constexpr bool kHasKeyValues = true;" in text
    fields = text.split("struct KeyValues {")[1].split("};")[0].split()
    assert fields == ["int", "k0;", "float", "k1;"]  # the mask's terms, then the score's
    body = text.split("KeyValues key_values(int kv_idx) const {")[1].split("return key;")[0]
    # Both indices stay inside their dims without a guard: read plainly.
    assert "key.k0 = p.p_doc[r.kv_start + kv_idx];" in body
    assert "key.k1 = p.p_t[(kv_idx % 64)];" in body
    for hook in ("score_at", "score_bias_at", "mask_at"):
        at = text.split(f" {hook}(")[1].split("\n  }")[0]
        assert "p.p_t" not in at and "p.p_doc" not in at, (hook, at)
    assert "key.k1" in text.split(" score_bias_at(")[1].split("\n  }")[0]
    assert "key.k0 == row." in text.split(" mask_at(")[1].split("\n  }")[0]


@pytest.mark.parametrize(
    "body, hooks",
    [("score = score * t[kv_idx];", ["score_at", "score_log2_at", "score_bias_at", "mask_at"]),
     ("normalize = none; score = sigmoid(score + t[kv_idx]);",
      ["score_at", "score_raw_at", "score_bias_at", "mask_at"])],
)  # fmt: skip
def test_each_element_hook_has_an_at_twin(body, hooks) -> None:
    text = _functor(f"variant v {{ param t: tensor<f32>[64]; {body} }}")
    assert [h for h in hooks if f" {h}(" in text] == hooks


def test_a_variant_without_key_reads_has_no_key_values() -> None:
    text = _functor("variant v { param t: tensor<f32>[64]; score = score + t[qo_head % 64]; }")
    assert "KeyValues" not in text and "_at(" not in text


def test_key_values_check_a_read_its_guards_keep_inside() -> None:
    """``key_values`` reads every key's values ahead of the guards: a read proven only under
    its guard (``t[7 - kv_idx]`` where ``kv_idx < 8``) is bounds-checked there, and stays plain
    in the hooks that evaluate it under the guard."""
    text = _functor(
        "variant v { param t: tensor<f32>[8]; score = kv_idx < 8 ? score + t[7 - kv_idx] : score; }"
    )
    body = text.split("KeyValues key_values(int kv_idx) const {")[1].split("return key;")[0]
    assert "key.k0 = attnc::vm::load_in_shape_(p.p_t, 0, " in body
    score = text.split(" score(const Row& row, float s, int kv_idx) const {")[1].split("}")[0]
    assert "load_in_shape_" not in score and "p.p_t[" in score


def _fields(text: str) -> list[str]:
    return text.split("struct KeyValues {")[1].split("};")[0].split()


def _hook(text: str, name: str) -> str:
    return text.split(f" {name}(")[1].split("\n  }")[0]


def test_a_key_term_holds_the_arithmetic_on_its_reads() -> None:
    """The affine bias ``0.5 * t[kv_idx] + 0.25 * t[idx[kv_idx]]`` depends on the key alone:
    one value per key (three reads folded), and so is ``log(1 + t[kv_idx])``: computed per key,
    not per element."""
    text = _functor(
        "variant v { param t: tensor<f32>[64]; param idx: tensor<i32>[kv_len];"
        " score = score + t[kv_idx % 64] * 0.5 + t[idx[kv_idx]] * 0.25; }"
    )
    assert _fields(text) == ["float", "k0;"]
    assert _hook(text, "score_bias_at").split("{")[1].strip() == "return key.k0;"
    text = _functor(
        "variant v { param t: tensor<f32>[64]; score = score - log(1.0 + t[kv_idx % 64]); }"
    )
    assert _fields(text) == ["float", "k0;"]
    assert "log_(" in text.split("KeyValues key_values(int kv_idx) const {")[1].split("}")[0]
    assert "log_(" not in _hook(text, "score_bias_at")


def test_a_key_condition_is_held_as_an_int() -> None:
    text = _functor(
        "variant v { param t: tensor<f32>[64]; mask = kv_idx <= q_pos && t[kv_idx % 64] > 0.0; }"
    )
    assert _fields(text) == ["int", "k0;"]
    assert "(key.k0 != 0)" in _hook(text, "mask_at")


def test_more_key_terms_than_a_kernel_stages_give_none() -> None:
    from attnc.codegen.key_values import MAX_KEY_TERMS

    terms = " && ".join(f"t[(kv_idx + {i}) % 64] > 0.0" for i in range(MAX_KEY_TERMS + 1))
    text = _functor(f"variant v {{ param t: tensor<f32>[64]; mask = kv_idx <= q_pos && {terms}; }}")
    assert "KeyValues" not in text and "kTouchKeyReads = true" not in text


@pytest.mark.parametrize(
    "body",
    [
        "param prefix: tensor<i32>[batch_size];"
        " score = score + (kv_idx < prefix[batch] ? 1.0 : 0.0);",
        "param cap: tensor<f32>[batch_size]; mask = kv_idx <= q_pos;"
        " score = score - log(1.0 + float(kv_idx)) * cap[batch];",
        "param t: tensor<f32>[4]; score = tanh(score) * (1.0 + t[0] * float(kv_idx % 4));",
    ],
)
def test_a_term_reads_at_an_index_built_from_the_key(body) -> None:
    """Reads that do not involve the key (request values) make no key term: a kernel stages a
    score's terms on the tiles where the score reads by key (``kScoreReadsByKey``), so a term
    without such a read would reach the unmasked tiles unstaged (it did, as zeros)."""
    text = _functor(f"variant v {{ {body} }}")
    assert "KeyValues" not in text and "kScoreReadsByKey" not in text


def test_every_score_term_makes_the_score_read_by_key() -> None:
    text = _functor(
        "variant v { param prefix: tensor<i32>[batch_size]; param t: tensor<f32>[64];"
        " score = score + (kv_idx < prefix[batch] ? t[kv_idx % 64] : 0.0); }"
    )
    assert _fields(text) == ["float", "k0;"]
    assert "static constexpr bool kScoreReadsByKey = true;" in text
