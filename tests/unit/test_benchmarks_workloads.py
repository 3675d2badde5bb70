"""Benchmark workloads, FLOP counting and the anchors' inputs (CPU only, no triton)."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import flops, workloads
from benchmarks.workloads import Mask


def test_decode_zipf_matches_anchors():
    lens = workloads.decode_zipf()
    assert (len(lens), sum(lens), min(lens), max(lens)) == (64, 231_550, 1_176, 32_768)


def test_decode_uniform_matches_anchors():
    lens = workloads.decode_uniform()
    assert (len(lens), sum(lens), min(lens), max(lens)) == (64, 539_950, 512, 16_254)


def test_prefill_zipf_matches_anchors():
    lens = workloads.prefill_zipf()
    assert (len(lens), sum(lens)) == (16, 55_385)


def test_batch_cases_use_the_anchor_workloads():
    cases = workloads.batch_cases()
    assert [c.label for c in cases] == ["decode_zipf", "decode_uniform", "prefill_zipf"]
    assert sum(cases[0].kv_lens) == 231_550 and sum(cases[2].lens) == 55_385


def test_quick_suites_are_small():
    assert 1 <= len(workloads.prefill_cases(quick=True)) <= 2
    assert 1 <= len(workloads.decode_cases(quick=True)) <= 2
    assert 1 <= len(workloads.batch_cases(quick=True)) <= 2


def test_prefill_rows_cover_anchors():
    names = {c.name for c in workloads.prefill_cases()}
    for expected in (
        "causal, L=8192",
        "soft-cap 30, L=2048",
        "ALiBi, L=8192",
        "sliding window 1024, L=2048",
        "causal, L=8192 D=64",
        "causal, L=8192 D=256",
        "causal, L=8192 GQA 1",
        "causal, L=8192 GQA 8",
    ):
        assert expected in names


def _brute_pairs(mask: Mask, q_len: int, kv_len: int) -> int:
    """Count pairs by evaluating the mask on every (q_idx, kv_idx)."""
    total = 0
    for q_idx, kv_idx in itertools.product(range(q_len), range(kv_len)):
        q_pos = q_idx + kv_len - q_len
        causal = kv_idx <= q_pos
        keep = {
            "none": True,
            "causal": causal,
            "window": causal and q_pos - kv_idx < mask.window,
            "prefix": causal or kv_idx < mask.prefix,
        }[mask.kind]
        total += keep
    return total


MASKS = [
    Mask("none"),
    Mask("causal"),
    Mask("window", window=1),
    Mask("window", window=5),
    Mask("window", window=64),
    Mask("prefix", prefix=3),
    Mask("prefix", prefix=50),
]
SHAPES = [(1, 1), (7, 7), (33, 33), (5, 40), (1, 37), (16, 19), (40, 40)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: f"{m.kind}{m.window or m.prefix}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}kv{s[1]}")
def test_pair_count_matches_brute_force(mask, shape):
    q_len, kv_len = shape
    assert flops.pair_count(mask, q_len, kv_len) == _brute_pairs(mask, q_len, kv_len)


def test_prefill_flops_causal_closed_form():
    n, heads, dim = 8192, 32, 128
    expected = 4 * (n * (n + 1) // 2) * heads * dim
    assert flops.prefill_flops(Mask("causal"), n, n, heads, dim) == expected


def test_batch_prefill_flops_is_sum_of_requests():
    lens = [3, 10, 17]
    total = flops.batch_prefill_flops(Mask("causal"), lens, 2, 8)
    assert total == sum(4 * n * (n + 1) // 2 * 2 * 8 for n in lens)


def test_decode_bytes_read_k_and_v_once():
    assert flops.decode_kv_bytes([4096] * 64, 8, 128) == 2 * 64 * 4096 * 8 * 128 * 2
    window = Mask("window", window=1024)
    assert flops.decode_kv_bytes([4096, 500], 8, 128, mask=window) == 2 * 1524 * 8 * 128 * 2


def test_fast_rows_are_a_prefix_of_the_full_rows():
    for cases in (workloads.prefill_cases, workloads.decode_cases):
        fast, full = cases(full=False), cases()
        assert 4 <= len(fast) < len(full) and full[: len(fast)] == fast
    assert {c.name for c in workloads.prefill_cases(full=False)} >= {
        "causal, L=8192",
        "soft-cap 30, L=8192",
        "ALiBi, L=8192",
        "sliding window 1024, L=8192",
        "sigmoid, L=8192",
        "prefix-LM 1024, L=8192",
    }


def test_page_table_and_dense_gather():
    import torch

    from benchmarks.inputs import dense_kv, page_table

    lens = [37, 16, 1]
    indptr, indices, last, pages = page_table(lens, 16, seed=3)
    assert indptr.tolist() == [0, 3, 4, 5] and pages == 5
    assert sorted(indices.tolist()) == list(range(5)) and last.tolist() == [5, 16, 1]
    equal = [40, 40]
    indptr, indices, last, pages = page_table(equal, 16, seed=4)
    cache = torch.randn(pages, 2, 16, 2, 8)
    k, v = dense_kv(cache, indices, 2, 40)
    assert k.shape == (2, 2, 40, 8)
    for b in range(2):
        for t in (0, 17, 39):
            page = int(indices[indptr[b] + t // 16])
            torch.testing.assert_close(k[b, :, t], cache[page, 0, t % 16])
            torch.testing.assert_close(v[b, :, t], cache[page, 1, t % 16])


def test_full_decode_rows_include_page_size_one():
    rows = workloads.decode_cases(full=True)
    ones = [r for r in rows if r.page_size == 1]
    assert len(ones) == 1 and ones[0].name.endswith(", page 1")
    assert len({r.name for r in rows}) == len(rows)  # every row has its own label
