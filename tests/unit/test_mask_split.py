"""Masks written with abs/min/max/clamp are analysed like their linear spellings: checked
against brute force on every pair of random requests and tiles."""

from __future__ import annotations

import random

import pytest
from test_mask_analysis import SHAPES, check, random_env

from attnc.compiler.mask_analysis import analyse_mask
from attnc.compiler.pipeline import compile_source


def mask_of(text: str):
    src = f"variant v {{ param window: i32 = 4; param prefix_len: i32 = 2; mask = {text}; }}"
    compiled, _ = compile_source(src, "v.attn")
    return compiled[0].variant.mask


# (mask text, expected kind, exact tile classes and ranges)
SPLIT_MASKS = {
    "abs_band": ("abs(q_pos - kv_idx) <= window", "linear", True),
    "abs_band_strict": ("abs(kv_idx - q_pos) < window", "linear", True),
    "abs_band_mirrored": ("window >= abs(q_pos - kv_idx)", "linear", True),
    "abs_outside_band": ("abs(q_pos - kv_idx) > window", "union", False),
    "abs_inside_sum": ("abs(q_pos - kv_idx) + 1 <= window", "union", False),
    "max_causal": ("max(kv_idx, prefix_len) <= q_pos", "linear", True),
    "min_window": ("min(q_pos, window) >= kv_idx", "linear", True),
    "min_or": ("min(q_pos - kv_idx, window) <= 2", "union", False),
    "clamp_equal": ("clamp(kv_idx, 0, window) == kv_idx", "union", False),
    "not_abs": ("!(abs(q_pos - kv_idx) > window)", "linear", True),
}


@pytest.mark.parametrize("name", list(SPLIT_MASKS))
def test_split_masks_against_brute_force(name: str) -> None:
    text, kind, exact = SPLIT_MASKS[name]
    mask = mask_of(text)
    a = analyse_mask(mask)
    assert a.kind == kind, a.describe()
    for seed in range(3):
        rng = random.Random(seed)
        for q_len, kv_len in SHAPES:
            check(a, mask, random_env(rng, q_len, kv_len), rng, exact)


def test_abs_band_analyses_like_two_inequalities() -> None:
    both = analyse_mask(mask_of("q_pos - kv_idx <= window && kv_idx - q_pos <= window"))
    assert analyse_mask(mask_of("abs(q_pos - kv_idx) <= window")) == both
