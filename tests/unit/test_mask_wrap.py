"""A linear mask whose i32 arithmetic wraps for some params: tile classes and KV ranges stay
conservative against brute force evaluated with wrapping, and masks that cannot wrap get no
run-time check."""

from __future__ import annotations

import random

import pytest
from test_mask_analysis import check

from attnc.compiler.mask_analysis import analyse_mask
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names

I32_MAX = 2**31 - 1


def mask_of(text: str):
    compiled, _ = compile_source(f"variant v {{ param window: i32 = 4; mask = {text}; }}", "v.attn")
    return compiled[0].variant.mask


@pytest.mark.parametrize(
    "text",
    [
        "window + kv_idx <= q_pos",
        "kv_idx - window >= q_pos",
        "q_pos - kv_idx < window * 3",
        "abs(q_pos - kv_idx + window) <= 3",
        "kv_idx <= q_pos && q_pos - kv_idx < window + 5",
    ],
)
@pytest.mark.parametrize("window", [I32_MAX, I32_MAX - 3, -(2**31), 2**30, 7])
def test_wrapping_masks_stay_conservative(text: str, window: int) -> None:
    mask = mask_of(text)
    a = analyse_mask(mask)
    assert a.kind in ("linear", "union") and a.wrap_guards, a.describe()
    rng = random.Random(window & 0xFFFF)
    for q_len, kv_len in [(7, 20), (20, 7), (13, 13)]:
        env = {"q_len": q_len, "kv_len": kv_len, "window": window}
        check(a, mask, env, rng, exact=False)


def test_masks_that_cannot_wrap_have_no_guard() -> None:
    for text in ("kv_idx <= q_pos", "q_pos - kv_idx < window", "kv_idx < window"):
        assert analyse_mask(mask_of(text)).wrap_guards == (), text
    for name in stdlib_names():
        compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
        for c in compiled:
            assert c.mask_analysis.wrap_guards == (), name


def test_plan_time_ranges_of_a_wrapping_request_cover_its_whole_kv() -> None:
    import numpy as np
    from mask_ranges_oracle import tile_kv_ranges

    guarded = analyse_mask(mask_of("window + kv_idx <= q_pos"))
    req, q0, q1 = np.array([0, 1]), np.array([0, 0]), np.array([4, 4])
    q_lens, kv_lens = np.array([4, 4]), np.array([10, 10])
    for window, want in ((I32_MAX, [(0, 10), (0, 10)]), (3, [(0, 7), (0, 7)])):
        ranges = tile_kv_ranges(guarded, {"window": window})
        assert ranges is not None
        begin, end = ranges(req, q0, q1, q_lens, kv_lens)
        assert list(zip(begin.tolist(), end.tolist(), strict=True)) == want, window
