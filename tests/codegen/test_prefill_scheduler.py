"""The prefill scheduler (the C++ host planner, attnc/kernels/host/prefill_plan*) on small
batches: tiles, split-KV chunks, the heaviest-first order, partial rows, the merge list, mask
ranges and tile maps. It equals the numpy oracle byte for byte (test_prefill_plan_native.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mask_ranges_oracle import tile_kv_ranges
from prefill_plan_helpers import PlanShape, make_host_plan

import attnc
from attnc.runtime.build import toolchain
from attnc.runtime.planning.mask_ranges import tile_range_program
from attnc.runtime.planning.prefill_plan import HEAD_ARRAYS
from attnc.runtime.planning.workspace import ALIGN, place_int32

pytestmark = pytest.mark.nvcc

try:
    toolchain.find_nvcc()
except toolchain.ToolNotFound:
    pytest.skip("nvcc not found", allow_module_level=True)

HEAD_DIM = 64
PART_ROW_BYTES = 4 * (HEAD_DIM + 1) + 32  # prefill_plan.cpp: a partial row and its list bytes


def _sched(q_lens, kv_lens, tile=16, hq=8, hkv=2, ctas=264, max_part_rows=1 << 30, ranges=None,
           host_map=None, kv_align=128):  # fmt: skip
    """The schedule of ragged requests; ``ranges`` a ``RangeProgram``, ``host_map`` a uint8
    tile map; the workspace holds ``max_part_rows`` partial rows beyond the lists."""
    q, kv = np.asarray(q_lens), np.asarray(kv_lens)
    qo = torch.from_numpy(np.concatenate([[0], np.cumsum(q)]))
    kv_indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(kv)]))
    tiles = int((-(-q // tile)).sum())
    base = dict.fromkeys(HEAD_ARRAYS, q.shape[0] + 1)
    lists = place_int32({**base, "items": tiles * hkv * 8, "merge_items": 0}).total_bytes
    reserve = 0 if host_map is None else host_map.shape[0]
    ws = lists + 4 * ALIGN + reserve + max_part_rows * PART_ROW_BYTES
    shape = PlanShape(hq, hkv, HEAD_DIM, tile, ctas, ws, kv_align)
    return make_host_plan(qo, kv_indptr, None, None, 1, shape, ranges, host_map, reserve).schedule


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
    ranges = tile_range_program(variant.compiled.mask_analysis)
    s = _sched([8192], [8192], tile=32, hq=32, hkv=8, ranges=ranges)
    assert s.num_merge == 0
    # Causal ranges: the heaviest tile sees all keys, the lightest only its own 32.
    assert s.items[0, 4] - s.items[0, 3] == 8192
    assert s.items[-1, 4] - s.items[-1, 3] == 32


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
    shape = PlanShape(hq, hkv, d, tile, num_ctas=8, workspace_bytes=4 << 20)
    host = make_host_plan(qo, kv, None, None, 1, shape)
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


def test_mask_params_given_to_plan_size_the_tile_ranges():
    from attnc.runtime.planning.mask_ranges import mask_bound_params

    window = attnc.load("stdlib:sliding_window").compiled.mask_analysis
    prefix = attnc.load("stdlib:prefix_lm").compiled.mask_analysis
    assert mask_bound_params(window) == {"window"}
    assert mask_bound_params(prefix) == {"prefix_len"}
    assert mask_bound_params(attnc.load("stdlib:causal").compiled.mask_analysis) == set()
    for params, known in (
        ({"other": 3}, False),
        ({"window": 1.5}, False),
        ({"window": 1024}, True),
    ):
        # only ints bound a linear mask; the rows exist exactly when the oracle's ranges do
        assert (tile_kv_ranges(window, params) is not None) is known, params
        assert (tile_range_program(window, params) is not None) is known, params
    ranges = tile_range_program(window, {"window": 1024})
    s = _sched([8192], [8192], tile=128, hq=32, hkv=8, ranges=ranges)
    lengths = s.items[:, 4] - s.items[:, 3]
    assert lengths.max() == 1024 + 127 and lengths.min() == 128  # the first tile: its own keys
    # prefix-LM 1024 over 8K: the last tile sees every key and runs first, the first tile
    # sees only the prefix; without the param every tile looked equally long.
    s = _sched(
        [8192],
        [8192],
        tile=128,
        hq=32,
        hkv=8,
        ranges=tile_range_program(prefix, {"prefix_len": 1024}),
    )
    assert s.items[0, 1] == 63 and s.items[0, 4] - s.items[0, 3] == 8192
    assert s.items[-1, 4] - s.items[-1, 3] == 1024
    assert (np.diff(s.cost) <= 0).all()


def test_scheduler_skips_empty_blocks():
    """One request, three tiles: tile 0 sees blocks 0-1, tile 1 nothing, tile 2 block 5 and
    7. Ranges shrink to the non-empty blocks; costs count only non-empty ones."""
    q_lens, kv_lens, tile = np.array([192]), np.array([512]), 64
    m = np.zeros(3 * 8, dtype=np.uint8)
    m[[0, 1]] = 2
    m[16 + 5], m[16 + 7] = 1, 2
    sched = _sched(q_lens, kv_lens, tile, 2, 1, 1, 1 << 20, host_map=m, kv_align=64)
    by_tile = {int(it[1]): (int(it[3]), int(it[4])) for it in sched.items}
    assert by_tile == {0: (0, 128), 1: (0, 0), 2: (320, 512)}
    cost = {int(it[1]): c for it, c in zip(sched.items, sched.cost, strict=True)}
    assert cost == {0: 64 + 128, 1: 64, 2: 64 + 128}


def test_split_tiles_chunk_by_loaded_work():
    """A long tile whose range holds few non-empty blocks is split by the KV it loads (its
    chunks' costs are their non-empty tokens), not by the length of its range: without the
    map the same tile is split."""
    q_lens, kv_lens, tile = np.array([64]), np.array([64 * 64]), 64
    m = np.zeros(64, dtype=np.uint8)
    m[[0, 63]] = 2  # the first and the last block: a range of 4096 keys, 128 loaded
    plain = _sched(q_lens, kv_lens, tile, 2, 1, 64, 1 << 20)  # every block loaded
    mapped = _sched(q_lens, kv_lens, tile, 2, 1, 64, 1 << 20, host_map=m)
    assert plain.num_items > 1 and mapped.num_items == 1
    assert mapped.cost.tolist() == [64 + 128]


_HUGE_BATCH_PROBE = """
import resource, torch, pytest
from tests.unit.test_prefill_call_memo import _wrapper, cpu_run
cpu_run._get_wrapped_function()(pytest.MonkeyPatch())
w, _ = _wrapper("causal")
small = torch.tensor([0, 16], dtype=torch.int32)
w.plan(small, small, 64, 8, 128)  # the planner library loaded
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
huge = torch.tensor([0, 2**31 - 2**16], dtype=torch.int32)
try:
    w.plan(huge, huge, 64, 8, 128)
except ValueError as err:
    print(str(err).split(",")[0])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_batch_too_large_for_the_workspace_is_refused_before_its_tiles_are_sized() -> None:
    """2^31 query tokens in a 4 MiB workspace: the planner sized its per-tile arrays (about
    4.8 GB, 8 s) before the workspace check refused the batch."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _HUGE_BATCH_PROBE], capture_output=True, text=True, cwd=root
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refusal, grown_mib = done.stdout.split("\n")[:2]
    assert refusal == "workspace_buffer: has 4194304 bytes"
    assert int(grown_mib) < 256, f"planning grew the process by {grown_mib} MiB"
