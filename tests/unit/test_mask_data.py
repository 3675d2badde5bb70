"""Mask analysis of masks that read data (language v2): comparisons reading per-token tensors
become data literals, the closed-form conjuncts around them still bound the KV range and the
EMPTY tiles, and no tile is called FULL; per-request tensors in bounds (window[batch]) are
per-request constants. Checked against brute force on random tensors."""

from __future__ import annotations

import random

import pytest
from tile_class_oracle import classify

from attnc.compiler.evaluate import evaluate
from attnc.compiler.mask_tiles import kv_range
from attnc.compiler.pipeline import compile_source

SPECS = {
    "doc_causal": (
        "param doc: tensor<i32>[kv_len];\n    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];"
    ),
    "doc_only": "param doc: tensor<i32>[kv_len];\n    mask = doc[kv_idx] == doc[q_pos];",
    "not_same_doc_window": (
        "param doc: tensor<i32>[kv_len];\n    param window: i32;\n"
        "    mask = kv_idx <= q_pos && !(doc[kv_idx] != doc[q_pos]) && q_pos - kv_idx < window;"
    ),
    "doc_or_prefix": (
        "param doc: tensor<i32>[kv_len];\n    param prefix_len: i32;\n"
        "    mask = kv_idx < prefix_len || (kv_idx <= q_pos && doc[kv_idx] == doc[q_pos]);"
    ),
    "query_token_bonus": (
        "param keep: tensor<i32>[q_len];\n    mask = kv_idx <= q_pos && keep[q_idx] > 0;"
    ),
    "per_request_window": (
        "param window: tensor<i32>[batch_size];\n"
        "    mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];"
    ),
    "per_request_prefix": (
        "param prefix: tensor<i32>[batch_size];\n"
        "    mask = kv_idx < prefix[batch] || kv_idx <= q_pos;"
    ),
}


def analysed(name: str):
    text = f"variant {name} {{\n    {SPECS[name]}\n}}\n"
    (c,), _ = compile_source(text, "x.attn")
    return c


def test_doc_causal_keeps_the_causal_bound_and_is_never_full() -> None:
    a = analysed("doc_causal").mask_analysis
    assert a.kind == "linear" and a.reads_data and len(a.constraints) == 1
    assert a.describe().endswith("; reads data: no tile is FULL")
    env = {"q_len": 64, "kv_len": 64}
    assert kv_range(a, 0, 16, env) == (0, 16)
    assert classify(a, 32, 48, 0, 16, env) == "partial"  # FULL in closed form, data decides
    assert classify(a, 0, 16, 32, 48, env) == "empty"


def test_per_request_window_is_linear_in_the_request_value() -> None:
    a = analysed("per_request_window").mask_analysis
    assert a.kind == "linear" and not a.reads_data
    assert "window[batch]" in a.describe()
    tensors = {"window": [4, 100]}
    env = {"q_len": 64, "kv_len": 64, "batch": 0}
    assert kv_range(a, 32, 33, env, tensors) == (29, 33)
    assert kv_range(a, 32, 33, {**env, "batch": 1}, tensors) == (0, 33)
    assert classify(a, 40, 41, 38, 40, env, tensors) == "full"


def _request(rng: random.Random, name: str):
    q_len = rng.randint(1, 70)
    kv_len = q_len + rng.choice([0, rng.randint(0, 40)])
    if rng.random() < 0.2:
        kv_len = max(1, q_len - rng.randint(0, q_len))
    batch = rng.randint(0, 3)
    tensors = {
        "doc": sorted(rng.randint(0, 3) for _ in range(kv_len)),
        "keep": [rng.randint(0, 1) for _ in range(q_len)],
        "window": [rng.randint(0, 40) for _ in range(4)],
        "prefix": [rng.randint(0, 30) for _ in range(4)],
    }
    if rng.random() < 0.3:
        rng.shuffle(tensors["doc"])
    env = {
        "q_len": q_len,
        "kv_len": kv_len,
        "batch": batch,
        "window": rng.randint(0, 40),
        "prefix_len": rng.randint(0, 30),
    }
    return env, tensors


def _visible(mask, env, tensors, q_idx: int, kv_idx: int) -> bool:
    q_pos = q_idx + env["kv_len"] - env["q_len"]
    point = {**env, "q_idx": q_idx, "q_pos": q_pos, "kv_idx": kv_idx}
    return bool(evaluate(mask, point, tensors))  # a read at q_pos < 0 gives 0


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tiles_and_ranges_against_brute_force(name: str) -> None:
    c = analysed(name)
    mask, a = c.variant.mask, c.mask_analysis
    rng = random.Random(name)
    checked = 0
    for _ in range(40):
        env, tensors = _request(rng, name)
        q_len, kv_len = env["q_len"], env["kv_len"]
        grid = [[_visible(mask, env, tensors, i, j) for j in range(kv_len)] for i in range(q_len)]
        for _ in range(12):
            q0 = rng.randrange(q_len)
            q1 = min(q_len, q0 + rng.randint(1, 16))
            k0 = rng.randrange(kv_len)
            k1 = min(kv_len, k0 + rng.randint(1, 16))
            pairs = [grid[i][j] for i in range(q0, q1) for j in range(k0, k1)]
            found = classify(a, q0, q1, k0, k1, env, tensors)
            if found == "empty":
                assert not any(pairs), (name, env, q0, q1, k0, k1)
            if found == "full":
                assert all(pairs), (name, env, q0, q1, k0, k1)
                assert not a.reads_data
            begin, end = kv_range(a, q0, q1, env, tensors)
            seen = [j for i in range(q0, q1) for j in range(kv_len) if grid[i][j]]
            assert all(begin <= j < end for j in seen), (name, env, q0, q1, begin, end)
            checked += 1
    assert checked == 480


def test_project_kv_takes_per_request_constants_from_a_batch_size_tensor() -> None:
    """The plan-time projection gets one constant per request (arrays, a vectorised bound):
    it equals the scalar kv_range of each request with its own window[batch]."""
    import numpy as np

    from attnc.compiler.mask_tiles import project_kv

    def bound(a, c, lo, hi):
        if a > 0:
            return np.maximum(lo, -(c // a)), hi
        if a < 0:
            return lo, np.minimum(hi, c // -a)
        ok = c >= 0
        return np.where(ok, lo, np.maximum(lo, 1)), np.where(ok, hi, np.minimum(hi, 0))

    a = analysed("per_request_window").mask_analysis
    rng = random.Random(7)
    windows = [rng.randint(0, 50) for _ in range(6)]
    q_lens = np.array([rng.randint(1, 40) for _ in range(6)])
    kv_lens = q_lens + np.array([rng.randint(0, 60) for _ in range(6)])
    envs = [
        {"q_len": int(q), "kv_len": int(k), "batch": b}
        for b, (q, k) in enumerate(zip(q_lens, kv_lens, strict=True))
    ]
    tensors = {"window": windows}
    cons = [
        (x.cq, x.ck, np.array([x.c_value(env, tensors) for env in envs])) for x in a.constraints
    ]
    q0 = np.zeros(6, dtype=np.int64)
    lo, hi = project_kv(cons, q0, q_lens - 1, np.zeros(6, dtype=np.int64), kv_lens - 1, bound)
    for b, env in enumerate(envs):
        want = kv_range(a, 0, int(q_lens[b]), env, tensors)
        got = (int(lo[b]), int(hi[b]) + 1) if lo[b] <= hi[b] else (0, 0)
        assert got == want, (b, env, windows[b])


def test_a_head_tensor_comparison_is_a_data_literal_too() -> None:
    """Any comparison reading a tensor per head, row or element (not only v2 tensors) is a
    data literal: never FULL, the KV range is that of the rest of the mask."""
    text = (
        "variant v {\n    param lens: tensor<i32>[num_qo_heads];\n"
        "    mask = kv_idx <= lens[qo_head] && kv_idx <= q_pos;\n}\n"
    )
    (c,), _ = compile_source(text, "x.attn")
    a = c.mask_analysis
    assert a.kind == "linear" and a.reads_data and len(a.constraints) == 1
    env = {"q_len": 8, "kv_len": 8}
    assert kv_range(a, 0, 4, env) == (0, 4)
    assert classify(a, 4, 8, 0, 4, env) == "partial"
    assert classify(a, 0, 4, 4, 8, env) == "empty"
