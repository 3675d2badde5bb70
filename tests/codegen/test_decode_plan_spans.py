"""The decode step's mask spans (attnc/kernels/host/decode_plan_spans.h, from the span table of
planning/decode_plan_spans.py) against mask_ranges.tile_kv_ranges + decode_spans, on the CPU:
stdlib masks with plan-time params and masks whose i32 arithmetic may wrap, with extreme
params and KV lengths."""

from __future__ import annotations

import decode_plan_harness as h
import numpy as np
import pytest

import attnc
from attnc.compiler.pipeline import compile_source
from attnc.runtime.planning.decode_plan_spans import span_table
from attnc.runtime.planning.mask_ranges import decode_spans, tile_kv_ranges

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

I32_MAX = 2**31 - 1
WINDOWS = [0, 1, 7, 300, 1024, -5, 2**30, I32_MAX - 3, I32_MAX, -(2**31)]
CUSTOM = [
    "window + kv_idx <= q_pos",
    "kv_idx - window >= q_pos",
    "q_pos - kv_idx < window * 3",
    "abs(q_pos - kv_idx + window) <= 3",
    "kv_idx <= q_pos && q_pos - kv_idx < window + 5",
    "kv_idx < window || q_pos - kv_idx < 3",
]


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    yield from h.fresh_library(tmp_path_factory)


def _analysis_of(source: str):
    if source.startswith("stdlib:"):
        return attnc.load(source).compiled.mask_analysis
    text = f"variant v {{ param window: i32 = 4; mask = {source}; }}"
    compiled, _ = compile_source(text, "v.attn")
    return compiled[0].mask_analysis


def _kv_lens(rng: np.random.Generator) -> np.ndarray:
    edges = [0, 1, 2, 63, 64, 65, 1023, 1024, 4096, 70000, I32_MAX - 1, I32_MAX]
    return np.array(edges + rng.integers(0, 100_000, 40).tolist(), dtype=np.int64)


CASES = [
    ("stdlib:sliding_window", "window"),
    ("stdlib:gpt_oss_local", "window"),
    ("stdlib:prefix_lm", "prefix_len"),
    ("stdlib:causal", None),
    *((text, "window") for text in CUSTOM),
]


@pytest.mark.parametrize(("source", "param"), CASES)
def test_step_spans_match_decode_spans(planner, source, param):
    p, _, _ = h.planner(8, 8, 8)
    analysis = _analysis_of(source)
    rng = np.random.default_rng(len(source))
    compared = 0
    for value in WINDOWS if param else [None]:
        params = {} if param is None else {param: value}
        ranges = tile_kv_ranges(analysis, params)
        assert ranges is not None, (source, analysis.describe())
        for q_len in (1, 2, 5, 8):
            table = span_table(analysis, params, q_len)
            assert table is not None
            for tile in (16, 64, 128):
                kv = _kv_lens(rng)
                want = decode_spans(ranges, kv, q_len, tile)
                got = p.spans(table, kv, q_len, tile)
                for g, w in zip(got, want, strict=True):
                    np.testing.assert_array_equal(g, w, err_msg=f"{source} {params} q{q_len}")
                compared += 1
    assert compared >= 12


def test_no_table_for_bounds_beyond_lengths_and_scalars():
    per_request = attnc.load("stdlib:per_request_window").compiled.mask_analysis
    assert span_table(per_request, {}, 1) is None  # window[batch]: a per-request tensor
    window = attnc.load("stdlib:sliding_window").compiled.mask_analysis
    assert span_table(window, {}, 1) is None  # the window's value is not known
    assert span_table(window, {"window": 2.5}, 1) is None  # only integers are folded
    assert span_table(attnc.load("stdlib:vanilla").compiled.mask_analysis, {}, 1) is None


def test_table_layout_and_malformed_tables(planner):
    p, _, _ = h.planner(8, 8, 8)
    window = attnc.load("stdlib:sliding_window").compiled.mask_analysis
    table = span_table(window, {"window": 100}, 2)
    # one term of two rows, no guards: q - k + kv - 2 >= 0 and -q + k - kv + 2 + 99 >= 0
    assert table.tolist() == [1, 0, 2, 1, -1, -2, 1, -1, 1, 101, -1]
    kv = np.array([0, 5, 1000], dtype=np.int64)
    offset, length = p.spans(table, kv, 2, 64)
    assert offset.tolist() == [0, 0, 896] and length.tolist() == [0, 5, 104]  # keys 899..
    for bad in ([], [0, 0], [1, 0, 3, 1, -1, 0, 0], [1, 1, 0], [1, 0, 0, 9]):
        with pytest.raises(ValueError, match="malformed span table"):
            p.spans(np.array(bad, dtype=np.int64), kv, 2, 64)
    with pytest.raises(ValueError, match="malformed span table"):
        p.spans(table, kv, 2, 0)  # kv_tile must be positive
