"""Hostile `.attn` programs against the compiler at the edges of its number types: requests
past 2**30 tokens (the tile classes and the affine bias step, as the kernels' i32 arithmetic
wraps) and f32 param defaults that are not doubles (test_hostile_compiler.py has the rest)."""

from __future__ import annotations

import pytest
from tile_class_oracle import classify

from attnc.compiler import mask_tiles
from attnc.compiler.bias_step import bias_step
from attnc.compiler.evaluate import evaluate
from attnc.compiler.pipeline import compile_source

LONG_KV = 1_500_000_000  # past 2**30, within the runtime's 2**31 - 2**16


@pytest.mark.parametrize(
    ("mask", "q_len"),
    [("2 * kv_idx < kv_len", 1), ("q_idx + q_len > 65536 && kv_idx >= 0", LONG_KV)],
)
def test_tile_classes_hold_for_requests_past_2_30_tokens(mask: str, q_len: int) -> None:
    """The no-wrap proof assumed lengths up to 2**30: at 1.5e9 keys ``2 * kv_idx`` wraps (as
    the kernels compute it) and the tile of key 1.2e9 was EMPTY, its keys past the planned
    range, though the mask keeps them."""
    (c,), _ = compile_source(f"variant h {{ mask = {mask}; }}", "h.attn")
    env = {"q_len": q_len, "kv_len": LONG_KV}
    q_idx, key = q_len - 1, 1_200_000_000
    kept = evaluate(c.variant.mask, {**env, "q_idx": q_idx, "kv_idx": key, "q_pos": LONG_KV - 1})
    tile = classify(c.mask_analysis, q_idx, q_idx + 1, key, key + 64, env)
    begin, end = mask_tiles.kv_range(c.mask_analysis, q_idx, q_idx + 1, env)
    if kept:  # the i32 mask (wrapping as the kernels compute it) keeps the key
        assert tile != "empty" and begin <= key < end
    else:
        assert tile != "full"


def test_no_bias_step_for_an_offset_that_wraps_past_2_30_tokens() -> None:
    """``float(kv_idx + q_pos)`` reaches twice the request length: stepped from a tile's
    first key it differed from the direct value by 4.3e6 at 1.5e9 keys."""
    (c,), _ = compile_source(
        "variant b { score = score - 0.001 * float(kv_idx + q_pos); }", "b.attn"
    )
    assert c.affine is not None and bias_step(c.affine.bias) is None
    (d,), _ = compile_source(
        "variant b { score = score - 0.001 * float(kv_idx - q_pos); }", "b.attn"
    )
    assert d.affine is not None and bias_step(d.affine.bias) is not None


@pytest.mark.parametrize(("literal", "want"), [("1e-46", 0.0), ("16777217", 16777216.0)])
def test_f32_param_defaults_are_the_f32_values_the_kernels_get(literal: str, want: float) -> None:
    """A default was kept as the nearest double: the reference used 1e-46 (positive) while
    the kernels got 0.0f, and 'attnc test' failed with relative error 2."""
    (c,), _ = compile_source(
        f"variant t {{ param c: f32 = {literal}; score = c > 0.0 ? score : -score; }}", "t.attn"
    )
    (param,) = c.variant.params
    assert param.default == want
