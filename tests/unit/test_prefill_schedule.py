"""Prefill scheduler: tiles, split-KV chunks, heaviest-first order, partial rows, merge list."""

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.planning import prefill_plan
from attnc.runtime.planning.mask_ranges import tile_kv_ranges
from attnc.runtime.planning.prefill_schedule import query_tiles, schedule_prefill


def _sched(q_lens, kv_lens, tile=16, hq=8, hkv=2, ctas=264, max_part_rows=1 << 30, ranges=None):
    return schedule_prefill(
        np.array(q_lens), np.array(kv_lens), tile, hq, hkv, ctas, 128, max_part_rows, ranges
    )


def test_query_tiles():
    req, j, q0, q1 = query_tiles(np.array([5, 0, 9]), 4)
    assert req.tolist() == [0, 0, 2, 2, 2]
    assert j.tolist() == [0, 1, 0, 1, 2]
    assert q0.tolist() == [0, 4, 0, 4, 8]
    assert q1.tolist() == [4, 5, 4, 8, 9]
    with pytest.raises(ValueError, match="tile_q_tokens: must be positive"):
        query_tiles(np.array([1]), 0)


def test_heaviest_first_and_deterministic():
    a = _sched([40, 16, 100], [50, 3000, 100], ctas=4)
    b = _sched([40, 16, 100], [50, 3000, 100], ctas=4)
    assert np.array_equal(a.items, b.items) and np.array_equal(a.merge_items, b.merge_items)
    assert (np.diff(a.cost) <= 0).all()
    # KV heads are inner: consecutive items of one chunk differ only in the head.
    assert a.items[:2, 2].tolist() == [0, 1]


def _coverage(s, kv_lens, tile):
    """KV tokens covered per (request, tile, head), and partial rows per item."""
    seen = {}
    for r, j, h, b, e, part, _, _ in s.items.tolist():
        seen.setdefault((r, j, h), []).append((b, e, part))
    return seen


def test_split_chunks_cover_the_range_once_and_partials_are_disjoint():
    q_lens, kv_lens, tile, hq = [3, 16, 40], [5000, 20000, 100], 16, 8
    s = _sched(q_lens, kv_lens, tile=tile, hq=hq)
    assert s.num_merge > 0 and s.chunk_size % 128 == 0
    merge = {(r, j): (n, base) for r, j, n, base in s.merge_items.tolist()}
    used = np.zeros(s.part_rows, dtype=np.int64)
    for (r, j, h), chunks in _coverage(s, kv_lens, tile).items():
        chunks.sort()
        assert chunks[0][0] == 0 and chunks[-1][1] == kv_lens[r]
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
        tokens = min(tile, q_lens[r] - j * tile)
        if len(chunks) == 1:
            assert chunks[0][2] == -1 and (r, j) not in merge
            continue
        n, base = merge[(r, j)]
        assert n == len(chunks)
        for c, (_, _, part) in enumerate(chunks):
            assert part == base + c * tokens * hq
            if h == 0:
                used[part : part + tokens * hq] += 1
    assert (used == 1).all()  # every partial row belongs to exactly one chunk


def test_no_split_when_partials_do_not_fit():
    s = _sched([3], [20000], max_part_rows=0)
    assert s.num_merge == 0 and s.part_rows == 0 and s.chunk_size == 0
    assert s.items[:, 3:6].tolist() == [[0, 20000, -1]] * 2


def test_long_prefill_is_not_split():
    # One 8K causal request: no tile is longer than a CTA's share of the work.
    variant = attnc.load("stdlib:causal")
    ranges = tile_kv_ranges(variant.compiled.mask_analysis)
    s = _sched([8192], [8192], tile=32, hq=32, hkv=8, ranges=ranges)
    assert s.num_merge == 0
    # Causal ranges: the heaviest tile sees all keys, the lightest only its own 32.
    assert s.items[0, 4] - s.items[0, 3] == 8192
    assert s.items[-1, 4] - s.items[-1, 3] == 32


def test_tile_ranges_only_for_param_free_masks():
    assert tile_kv_ranges(attnc.load("stdlib:vanilla").compiled.mask_analysis) is None
    assert tile_kv_ranges(attnc.load("stdlib:sliding_window").compiled.mask_analysis) is None
    assert tile_kv_ranges(attnc.load("stdlib:causal").compiled.mask_analysis) is not None


def test_empty_kv_still_gets_an_item():
    s = _sched([5, 0], [0, 7])
    assert s.items[:, :6].tolist() == [[0, 0, 0, 0, 0, -1], [0, 0, 1, 0, 0, -1]]


def _np_attention(q, k, v):
    s = q @ k.T
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    return p @ v / p.sum(axis=1, keepdims=True), (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]


def test_plan_layout_and_merge_arithmetic():
    """Simulate the kernels on the plan's partial rows: the merge recovers full attention."""
    hq, hkv, d, tile = 2, 1, 8, 4
    qo = torch.tensor([0, 3, 8])
    kv = torch.tensor([0, 1500, 1500 + 2600])
    shape = prefill_plan.PlanShape(hq, hkv, d, tile, num_ctas=8, workspace_bytes=4 << 20)
    host = prefill_plan.make_host_plan(qo, kv, None, None, 1, shape)
    s = host.schedule
    assert s.num_merge > 0
    assert host.part_o_offset >= host.layout.total_bytes
    assert host.part_lse_offset >= host.part_o_offset + 4 * d * s.part_rows
    assert host.total_bytes <= shape.workspace_bytes
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, hq, d))
    k = rng.standard_normal((4100, hkv, d))
    v = rng.standard_normal((4100, hkv, d))
    part_o = np.full((s.part_rows, d), np.nan)
    part_lse = np.full(s.part_rows, np.nan)
    for r, j, h, b, e, part, _, _ in s.items.tolist():
        if part < 0:
            continue
        q_start, kv_start = int(qo[r]), int(kv[r])
        t0, t1 = j * tile, min(j * tile + tile, int(qo[r + 1] - qo[r]))
        for t in range(t0, t1):
            for head in range(h * hq // hkv, (h + 1) * hq // hkv):
                o, lse = _np_attention(
                    q[q_start + t, head][None], k[kv_start + b : kv_start + e, h],
                    v[kv_start + b : kv_start + e, h],
                )  # fmt: skip
                row = part + (t - t0) * hq + head
                part_o[row], part_lse[row] = o[0], lse[0]
    for r, j, n, base in s.merge_items.tolist():
        q_start, kv_start, kv_end = int(qo[r]), int(kv[r]), int(kv[r + 1])
        tokens = min(tile, int(qo[r + 1] - qo[r]) - j * tile)
        for t in range(tokens):
            for head in range(hq):
                rows = [base + c * tokens * hq + t * hq + head for c in range(n)]
                w = np.exp(part_lse[rows] - part_lse[rows].max())
                merged = (w[:, None] * part_o[rows]).sum(0) / w.sum()
                want, _ = _np_attention(
                    q[q_start + j * tile + t, head][None], k[kv_start:kv_end, 0],
                    v[kv_start:kv_end, 0],
                )  # fmt: skip
                np.testing.assert_allclose(merged, want[0], rtol=1e-10, atol=1e-12)


MASKS = [
    "q_idx + kv_len - q_len >= kv_idx",  # causal
    "kv_idx < 100 || q_idx + kv_len - q_len >= kv_idx",  # prefix-LM with a fixed prefix
    "kv_idx <= q_idx + kv_len - q_len && q_idx + kv_len - q_len - kv_idx < 300",  # window
    "kv_idx >= kv_len - 64 || kv_idx < 8",  # union with a request-level bound
    "q_idx * 2 >= kv_idx",
]


@pytest.mark.parametrize("mask", MASKS)
def test_vectorised_tile_ranges_match_the_compiler(mask):
    from attnc.compiler import mask_tiles
    from attnc.compiler.pipeline import compile_source

    (compiled,), _ = compile_source(f"variant v {{\n mask = {mask};\n}}\n", "m.attn")
    analysis = compiled.mask_analysis
    ranges = tile_kv_ranges(analysis)
    assert ranges is not None, analysis.describe()
    rng = np.random.default_rng(1)
    q_lens = rng.integers(0, 700, 12)
    kv_lens = np.maximum(q_lens, rng.integers(0, 2000, 12))
    req, _, q0, q1 = query_tiles(q_lens, 37)
    begin, end = ranges(req, q0, q1, q_lens, kv_lens)
    for i in range(req.shape[0]):
        r = int(req[i])
        env = {"q_len": int(q_lens[r]), "kv_len": int(kv_lens[r])}
        want = mask_tiles.kv_range(analysis, int(q0[i]), int(q1[i]), env)
        assert (int(begin[i]), int(end[i])) == want, (i, env, int(q0[i]), int(q1[i]))


def test_mask_params_given_to_plan_size_the_tile_ranges():
    from attnc.runtime.planning.mask_ranges import mask_bound_params

    window = attnc.load("stdlib:sliding_window").compiled.mask_analysis
    prefix = attnc.load("stdlib:prefix_lm").compiled.mask_analysis
    assert mask_bound_params(window) == {"window"}
    assert mask_bound_params(prefix) == {"prefix_len"}
    assert mask_bound_params(attnc.load("stdlib:causal").compiled.mask_analysis) == set()
    assert tile_kv_ranges(window, {"other": 3}) is None
    assert tile_kv_ranges(window, {"window": 1.5}) is None  # only ints bound a linear mask
    ranges = tile_kv_ranges(window, {"window": 1024})
    assert ranges is not None
    s = _sched([8192], [8192], tile=128, hq=32, hkv=8, ranges=ranges)
    lengths = s.items[:, 4] - s.items[:, 3]
    assert lengths.max() == 1024 + 127 and lengths.min() == 128  # the first tile: its own keys
    # prefix-LM 1024 over 8K: the last tile sees every key and runs first, the first tile
    # sees only the prefix; without the param every tile looked equally long.
    s = _sched(
        [8192], [8192], tile=128, hq=32, hkv=8, ranges=tile_kv_ranges(prefix, {"prefix_len": 1024})
    )
    assert s.items[0, 1] == 63 and s.items[0, 4] - s.items[0, 3] == 8192
    assert s.items[-1, 4] - s.items[-1, 3] == 1024
    assert (np.diff(s.cost) <= 0).all()


@pytest.mark.parametrize(
    "mask",
    [
        "kv_idx < prefix || q_idx + kv_len - q_len >= kv_idx",
        "kv_idx <= q_idx + kv_len - q_len && q_idx + kv_len - q_len - kv_idx < window",
        "kv_idx >= kv_len - window || kv_idx < prefix",
        "kv_idx + 3000 < q_len * prefix || q_idx + kv_len - q_len >= kv_idx",  # a product atom
    ],
)
def test_vectorised_tile_ranges_with_params_match_the_compiler(mask):
    from attnc.compiler import mask_tiles
    from attnc.compiler.pipeline import compile_source

    src = f"variant v {{\n param prefix: i32 = 0;\n param window: i32 = 1;\n mask = {mask};\n}}\n"
    (compiled,), _ = compile_source(src, "m.attn")
    analysis = compiled.mask_analysis
    params = {"prefix": 77, "window": 300}
    ranges = tile_kv_ranges(analysis, params)
    assert ranges is not None, analysis.describe()
    rng = np.random.default_rng(2)
    q_lens = rng.integers(0, 700, 12)
    kv_lens = np.maximum(q_lens, rng.integers(0, 2000, 12))
    req, _, q0, q1 = query_tiles(q_lens, 37)
    begin, end = ranges(req, q0, q1, q_lens, kv_lens)
    for i in range(req.shape[0]):
        r = int(req[i])
        env = {**params, "q_len": int(q_lens[r]), "kv_len": int(kv_lens[r])}
        want = mask_tiles.kv_range(analysis, int(q0[i]), int(q1[i]), env)
        assert (int(begin[i]), int(end[i])) == want, (i, env, int(q0[i]), int(q1[i]))


def test_plan_params_are_checked():
    from attnc.runtime.checks.params import check_plan_params

    decls = attnc.load("stdlib:alibi").params + attnc.load("stdlib:sliding_window").params
    assert check_plan_params(decls, {"window": 7}, variant_name="v") == {"window": 7}
    with pytest.raises(ValueError, match="variant 'v': unknown param 'windw'; did you mean"):
        check_plan_params(decls, {"windw": 7}, variant_name="v")
    with pytest.raises(ValueError, match="param 'window' \\(i32\\): expected an int, got float"):
        check_plan_params(decls, {"window": 7.0}, variant_name="v")
    with pytest.raises(ValueError, match="param 'slopes' .*plan\\(\\) takes scalar params only"):
        check_plan_params(decls, {"slopes": torch.zeros(4)}, variant_name="v")


def test_planned_mask_from_plan_params_and_the_run_check():
    from attnc.runtime.planning.mask_ranges import PlannedMask

    window = attnc.load("stdlib:sliding_window")
    planned = PlannedMask.from_plan_params(window, {"window": 1024})
    assert planned.ranges is not None and planned.values == {"window": 1024}
    planned.check_run("sliding_window", {"window": 1024})
    with pytest.raises(
        ValueError, match="param 'window' is 512 in run\\(\\), but plan\\(\\) was given 1024"
    ):
        planned.check_run("sliding_window", {"window": 512})
    unknown = PlannedMask.from_plan_params(window, {})  # the width is not known at plan time
    assert unknown.ranges is None and unknown.values == {}
    causal = PlannedMask.from_plan_params(attnc.load("stdlib:causal"), {})
    assert causal.ranges is not None and causal.values == {}  # bounds without params
    softcap = PlannedMask.from_plan_params(attnc.load("stdlib:softcap"), {"cap": 30.0})
    assert softcap.values == {}  # params the mask does not read are checked, not kept
    with pytest.raises(ValueError, match="expected a float, got str"):
        PlannedMask.from_plan_params(attnc.load("stdlib:softcap"), {"cap": "30"})


def test_planned_mask_is_remembered_per_value_and_type():
    from attnc.runtime.planning.mask_ranges import PlannedMask

    window = attnc.load("stdlib:sliding_window")
    first = PlannedMask.from_plan_params(window, {"window": 64})
    assert PlannedMask.from_plan_params(window, {"window": 64}) is first
    assert PlannedMask.from_plan_params(window, {"window": 65}).values == {"window": 65}
    with pytest.raises(ValueError, match="expected an int, got float"):
        PlannedMask.from_plan_params(window, {"window": 64.0})  # equal value, other type
    with pytest.raises(ValueError, match="expected an int, got list"):
        PlannedMask.from_plan_params(window, {"window": [64]})  # unhashable: checked anyway
