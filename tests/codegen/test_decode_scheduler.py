"""What the decode planner decides (the C++ planner, through its test outputs): chunking,
balance, order, determinism, split choice, partial slots and capacity; and the oracle's LPT
rule on its own."""

import decode_plan_harness as h
import decode_schedule_oracle as s
import numpy as np
import pytest
from mask_ranges_oracle import decode_spans

from attnc.runtime.planning import decode_plan
from attnc.runtime.planning.workspace import CapacityError

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

CTAS, TILE = 264, 64
ZIPF = [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(64)]
UNIFORM = [512 + int(15872 * ((i * 0.6180339887) % 1.0)) for i in range(64)]


@pytest.fixture(scope="module", autouse=True)
def _library(tmp_path_factory):
    yield from h.fresh_library(tmp_path_factory)


def _plan(lengths, q_len=1, hq=32, hkv=8, row_blocks=1, ctas=CTAS, part_rows=1 << 24, *,
          max_items=None, min_chunk=None, visible=None):  # fmt: skip
    """The C++ planner's schedule (checked against the oracle's on the way)."""
    kv = np.asarray(lengths, dtype=np.int64)
    p, _, _ = h.planner(kv.shape[0], max_items or 1 << 16, ctas)
    p.configure(q_len, hq, hkv, row_blocks, ctas, TILE, part_rows, 16, max_items,
                min_chunk=min_chunk)  # fmt: skip
    spans = None if visible is None else decode_spans(lambda *_: visible, kv, q_len, TILE)
    p.set_visible(spans)
    _, sched = h.native_schedule(p, kv, np.zeros(kv.shape[0], np.int64))
    ref = s.schedule(kv, q_len, hq, hkv, row_blocks, ctas, TILE, part_rows,
                     max_items=max_items, min_chunk=min_chunk, spans=spans)  # fmt: skip
    for f in ("items", "cta_indptr", "merge_items", "num_chunks", "cost"):
        assert getattr(sched, f).tobytes() == getattr(ref, f).tobytes(), f
    return sched


def _coverage(plan, lengths, hkv, row_blocks):
    """(request, head, row block) -> sorted list of (begin, end) chunks."""
    cover = {}
    for it in plan.items:
        cover.setdefault((int(it[0]), int(it[1]), int(it[2])), []).append((int(it[3]), int(it[4])))
    assert len(cover) == len(lengths) * hkv * row_blocks
    return {k: sorted(v) for k, v in cover.items()}


@pytest.mark.parametrize("lengths", [ZIPF, UNIFORM, [4096] * 64, [1, 0, 70000, 5], [7] * 300])
def test_chunks_tile_each_request_exactly(lengths):
    plan = _plan(lengths, row_blocks=2)
    for (r, _, _), chunks in _coverage(plan, lengths, 8, 2).items():
        assert chunks[0][0] == 0 and chunks[-1][1] == lengths[r]
        for (b0, e0), (b1, _) in zip(chunks, chunks[1:], strict=False):
            assert e0 == b1 and e0 > b0
        assert all(b % TILE == 0 for b, _ in chunks)  # chunk starts are tile aligned


def test_balance_on_skewed_workloads():
    for lengths in (ZIPF, UNIFORM, [4096] * 64):
        loads = _plan(lengths).cta_loads()
        assert loads.max() <= 1.3 * loads.mean(), (loads.max(), loads.mean())


def test_cost_model_and_order():
    plan = _plan(UNIFORM)
    length = plan.items[:, 4] - plan.items[:, 3]
    assert np.allclose(plan.cost, decode_plan.ALPHA * 1 + decode_plan.BETA * length)
    # CTA b runs items [cta_indptr[b], cta_indptr[b+1]), heaviest first.
    assert plan.cta_indptr[0] == 0 and plan.cta_indptr[-1] == plan.num_items
    assert (np.diff(plan.cta_indptr) >= 0).all()
    assert plan.cta_indptr.shape == (CTAS + 1,)
    for b in range(CTAS):
        run = plan.cost[plan.cta_indptr[b] : plan.cta_indptr[b + 1]]
        assert (np.diff(run) <= 0).all()


def test_oracle_lpt_assignment():
    # Heaviest first to the least-loaded CTA, lowest index on ties.
    cta = s.assign_lpt(np.array([10.0, 9.0, 5.0, 4.0, 3.0, 1.0]), 3)
    assert cta.tolist() == [0, 1, 2, 2, 1, 2]


@pytest.mark.parametrize(
    ("lengths", "split"), [([4096] * 64, False), (ZIPF, True), (UNIFORM, False)]
)
def test_split_choice_on_anchor_batches(lengths, split):
    """The chunk choice the H200 measurements favoured (see docs/runtime.md)."""
    plan = _plan(lengths)
    assert (plan.chunk_size > 0) == split
    loads = plan.cta_loads() + s.ITEM_OVERHEAD * np.diff(plan.cta_indptr)
    ideal = (decode_plan.ALPHA + s.ITEM_OVERHEAD) * plan.num_items / CTAS + sum(lengths) * 8 / CTAS
    assert loads.max() <= 1.15 * ideal


def test_deterministic():
    a, b = _plan(ZIPF), _plan(list(ZIPF))
    assert np.array_equal(a.items, b.items)
    assert np.array_equal(a.cta_indptr, b.cta_indptr)
    assert np.array_equal(a.merge_items, b.merge_items)


def test_split_only_when_needed():
    # Enough (request, head) units to fill every CTA with short requests: no split at all.
    plan = _plan([100] * 256)
    assert plan.chunk_size == 0 and plan.num_part_slots == 0 and plan.merge_rows == 0
    assert (plan.items[:, 5] == -1).all() and plan.num_items == 256 * 8
    # One long request among short ones: only the long one is split.
    lengths = [64] * 8 + [65536]
    plan = _plan(lengths)
    split = {int(r) for r in plan.items[plan.items[:, 5] >= 0, 0]}
    assert split == {8}
    assert plan.merge_items.tolist() == [[8, int(plan.num_chunks[8]), 0, 0]]
    assert plan.merge_rows == 1 * 1 * 32
    # A larger minimum chunk turns splitting off.
    assert _plan(lengths, min_chunk=1 << 20).num_part_slots == 0


def test_partial_slots_are_distinct_and_ordered():
    plan = _plan(ZIPF, q_len=3)
    parts = plan.items[plan.items[:, 5] >= 0]
    slots = {}
    for it in parts:
        slots.setdefault(int(it[5]), set()).add((int(it[0]), int(it[3])))
    # One slot per (request, chunk), shared by that chunk's heads.
    assert all(len(v) == 1 for v in slots.values())
    assert sorted(slots) == list(range(plan.num_part_slots))
    for req, n, base, _ in plan.merge_items.tolist():
        begins = sorted(b for (r, b) in (next(iter(slots[base + c])) for c in range(n)))
        assert [next(iter(slots[base + c]))[1] for c in range(n)] == begins
        assert all(next(iter(slots[base + c]))[0] == req for c in range(n))
    assert plan.merge_rows == plan.merge_items.shape[0] * 3 * 32


def test_partial_capacity_limits_splitting():
    full = _plan([65536])
    rows = full.num_part_slots * 32
    limited = _plan([65536], part_rows=rows // 4)
    assert 0 < limited.num_part_slots * 32 <= rows // 4
    assert _plan([65536], part_rows=0).num_part_slots == 0


def test_capacity_error_on_items():
    with pytest.raises(CapacityError, match="needs 2048 work items, the wrapper holds 100"):
        _plan([100] * 256, max_items=100)


def test_visible_ranges_chunk_only_what_the_mask_shows():
    kv = np.full(64, 4096)
    whole = _plan(kv)
    begin = kv - 1000  # a window of 1000 keys, begin not tile-aligned
    plan = _plan(kv, visible=(begin, kv))
    first = begin // TILE * TILE
    items = plan.items
    for r in range(64):
        mine = items[items[:, 0] == r]
        cover = sorted({(int(b), int(e)) for b, e in mine[:, 3:5]})
        assert cover[0][0] == first[r] and cover[-1][1] == 4096  # the visible range, tiled
        assert all(a[1] == b[0] for a, b in zip(cover, cover[1:], strict=False))
    assert plan.cost.sum() < whole.cost.sum() / 3  # 1000 (+ part of a tile) of 4096 keys
    # begin is rounded down to a tile: [50, 50) becomes [0, 50), which the kernel clips
    short = _plan(np.array([50, 300]), visible=(np.array([50, 0]), np.array([50, 300])))
    assert {(int(b), int(e)) for b, e in short.items[short.items[:, 0] == 0][:, 3:5]} == {(0, 50)}


def test_work_region_header_and_arrays_in_the_buffer():
    """The bytes the kernels read, at the layout's offsets (decode_args.h)."""
    from attnc.runtime.planning import workspace as w

    kv = np.array([10, 3000], dtype=np.int64)
    p, buf, lay = h.planner(4, 64, 8, workspace=1 << 20, max_pages=100)
    p.configure(1, 32, 8, 1, 8, TILE, 1 << 24, 16, None)
    plan = h.plan_only(p, kv, np.array([0, 1], np.int64))
    ints = buf[: plan.work_bytes].view(np.int32)
    header = ints[: w.HEADER_INTS]
    assert header[:5].tolist() == [plan.num_items, 1, 2, plan.merge_rows, plan.num_split]
    assert ints[lay.cta_indptr // 4 : lay.cta_indptr // 4 + 9].tolist() == plan.cta_indptr.tolist()
    assert ints[lay.req_page_begin // 4 : lay.req_page_begin // 4 + 2].tolist() == [0, 1]
    assert ints[lay.req_kv_len // 4 : lay.req_kv_len // 4 + 2].tolist() == [10, 3000]
    assert np.array_equal(ints[lay.items // 4 :].reshape(-1, w.ITEM_INTS), plan.items)
    assert plan.work_bytes == lay.work_bytes(plan.num_items)
