"""The C++ decode planner against its oracle (decode_schedule_oracle.py): the same work regions
and the same schedules, bit for bit, on random and edge-case batches; its limits, its build
failures and the page-table checks of its step."""

import dataclasses

import decode_plan_harness as h
import decode_schedule_oracle as s
import numpy as np
import pytest
from mask_ranges_oracle import decode_spans

from attnc.runtime import abi
from attnc.runtime.build import jit
from attnc.runtime.planning import decode_plan, decode_plan_library
from attnc.runtime.planning.workspace import CapacityError, make_layout

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

HEADS = [(32, 8), (32, 32), (32, 4)]
FIELDS = ("items", "cta_indptr", "merge_items", "num_chunks", "cost")
SENTINEL = h.SENTINEL


@pytest.fixture(scope="module", autouse=True)
def _library(tmp_path_factory):
    yield from h.fresh_library(tmp_path_factory)


def _lengths(rng, batch):
    kind = rng.integers(4)
    if kind == 0:  # uniform
        return rng.integers(1, 32769, batch)
    if kind == 1:  # skewed: mostly short, a few long
        short = rng.integers(1, 512, batch)
        return np.where(rng.random(batch) < 0.1, rng.integers(8192, 32769, batch), short)
    if kind == 2:  # zipf as in the anchors, shuffled
        z = [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(batch)]
        return rng.permutation(np.array(z))
    # numpy's zipf draws (clipped before scaling so the product cannot wrap)
    return np.minimum(32768, np.minimum(rng.zipf(1.3, batch), 32768) * int(rng.integers(1, 64)))


def _same_schedule(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert x.tobytes() == y.tobytes(), f
    for f in ("chunk_size", "num_part_slots", "merge_rows", "num_items"):
        x, y = getattr(a, f), getattr(b, f)
        assert type(x) is type(y) and x == y, f


def _spans(kv, visible, tile):
    """The planner's spans of ``visible`` = (begin, end) per request (clipped, the start
    rounded down to a tile: mask_ranges_oracle.decode_spans)."""
    return decode_spans(lambda *_: visible, kv, 1, tile)


def _check(kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows, *, max_items=None,
           min_chunk=None, page_dtype=np.int64, rng=None, visible=None,
           split_factors=None):  # fmt: skip
    """The oracle's schedule + write_work_region against the C++ planner (with and without
    its test outputs). Returns the oracle Schedule, or the CapacityError message."""
    kv = np.asarray(kv, dtype=np.int64)
    batch = kv.shape[0]
    spans = None if visible is None else _spans(kv, visible, tile)
    args = (kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows)
    try:
        ref = s.schedule(*args, max_items=max_items, min_chunk=min_chunk, spans=spans,
                         split_factors=split_factors)  # fmt: skip
        error, cap = None, max(ref.num_items, 1)
    except CapacityError as exc:
        ref, error, cap = None, str(exc), max(max_items or 1, 1)
    page_begin = (np.arange(batch, dtype=np.int64) * 3 - 7).astype(page_dtype)
    if rng is not None and batch and rng.random() < 0.1:
        page_begin[0] = (1 << 31) + 5 if page_dtype == np.int64 else -3  # keeps the low bits
    for with_arrays in (False, True):
        p, buf, lay = h.planner(batch, cap, ctas)
        p.configure(q_len, hq, hkv, row_blocks, ctas, tile, part_rows, 16, max_items,
                    min_chunk=min_chunk, split_factors=split_factors)  # fmt: skip
        p.set_visible(spans)
        expect = np.full_like(buf, SENTINEL)
        call = h.native_schedule if with_arrays else h.plan_only
        if error is not None:
            with pytest.raises(CapacityError) as info:
                call(p, kv, page_begin)
            assert str(info.value) == error
            assert (buf == SENTINEL).all()  # nothing written
            continue
        nbytes = s.write_work_region(expect, lay, ref, q_len, page_begin, kv)
        out = call(p, kv, page_begin)
        plan = out[0] if with_arrays else out
        got = (plan.num_items, plan.num_split, plan.merge_rows, plan.chunk_size,
               plan.num_part_slots, plan.work_bytes)  # fmt: skip
        assert got == (ref.num_items, ref.merge_items.shape[0], ref.merge_rows, ref.chunk_size,
                       ref.num_part_slots, nbytes)  # fmt: skip
        assert buf.tobytes() == expect.tobytes()
        if with_arrays:
            _same_schedule(out[1], ref)
    return ref if error is None else error


def test_random_workloads_identical():
    rng = np.random.default_rng(1234)
    capacity_errors = doubled = split = 0
    for trial in range(3000):
        batch = int(rng.integers(1, 257))
        kv = _lengths(rng, batch).astype(np.int64)
        hq, hkv = HEADS[trial % 3]
        q_len = int(rng.integers(1, 9))
        row_blocks = int(rng.integers(1, 3))
        ctas = int(rng.choice([1, 7, 132, 264, 1056]))
        tile = int(rng.choice([16, 64, 128]))
        page_dtype = np.int32 if trial % 2 else np.int64
        free = s.schedule(kv, q_len, hq, hkv, row_blocks, ctas, tile, 1 << 40)
        part_rows = 1 << 40
        if free.num_part_slots and rng.random() < 0.5:
            # Fewer partial rows than the first chunk wants: the doubling loop runs.
            part_rows = int(free.num_part_slots * q_len * hq * rng.uniform(0.0, 0.9))
        max_items = None
        if rng.random() < 0.3:
            probe = s.schedule(kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows)
            max_items = int(probe.num_items * rng.uniform(0.5, 1.2))
        plan = _check(kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows,
                      max_items=max_items, page_dtype=page_dtype, rng=rng)  # fmt: skip
        if isinstance(plan, str):
            capacity_errors += 1
            continue
        doubled += plan.chunk_size > free.chunk_size > 0
        split += plan.num_part_slots > 0
    assert capacity_errors > 50 and doubled > 50 and split > 500, (capacity_errors, doubled, split)


def test_random_visible_ranges_identical():
    """Plans of only the KV a mask shows, as a sliding window gives them."""
    rng = np.random.default_rng(99)
    narrowed = split = 0
    for trial in range(800):
        batch = int(rng.integers(1, 129))
        kv = _lengths(rng, batch).astype(np.int64)
        hq, hkv = HEADS[trial % 3]
        q_len = int(rng.integers(1, 9))
        tile = int(rng.choice([16, 64]))
        if trial % 4 == 0:  # arbitrary ranges, also outside the request
            begin = rng.integers(-100, kv + 100)
            end = begin + rng.integers(-50, kv + 200)
        else:  # a window of w keys before each request's end
            w = int(rng.choice([1, 100, 1024, 4096]))
            begin, end = np.maximum(kv - q_len - w + 1, 0), kv
        ctas = int(rng.choice([7, 264, 1056]))
        plan = _check(kv, q_len, hq, hkv, 1, ctas, tile, 1 << 40, visible=(begin, end))
        assert not isinstance(plan, str)
        narrowed += bool((plan.items[:, 3] > 0).any())
        split += plan.num_part_slots > 0
    assert narrowed > 300 and split > 100, (narrowed, split)


def test_other_split_factors_identical():
    """The candidate set is an argument (the split sweep harness varies it)."""
    rng = np.random.default_rng(7)
    sets = [(), (1,), (2,), (8,), (1, 3, 5, 7), (4, 2, 1), (1, 1, 2)]
    for trial in range(300):
        kv = _lengths(rng, int(rng.integers(1, 129))).astype(np.int64)
        hq, hkv = HEADS[trial % 3]
        _check(kv, int(rng.integers(1, 5)), hq, hkv, 1, int(rng.choice([7, 264])), 64, 1 << 40,
               split_factors=sets[trial % len(sets)])  # fmt: skip


@pytest.mark.parametrize(
    "lengths",
    [[], [0], [0, 0, 0], [1], [1, 0, 70000, 5], [7] * 300, [2**31 - 2**16], [2**20] * 3],
)
def test_edge_lengths(lengths):
    for min_chunk in (None, 1, 64, 1 << 20):
        for ctas in (1, 264):
            for part_rows in (1 << 24, 0, -5):
                _check(lengths, 1, 32, 8, 1, ctas, 64, part_rows, min_chunk=min_chunk)


def test_anchor_workloads():
    zipf = [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(64)]
    uniform = [512 + int(15872 * ((i * 0.6180339887) % 1.0)) for i in range(64)]
    for kv in (zipf, uniform, zipf * 4):
        for q_len in (1, 4, 8):
            for hq, hkv in HEADS:
                _check(kv, q_len, hq, hkv, 1, 132 * 8, 64, 1 << 20)


def test_step_plan_reads_back_its_arrays_until_the_next_plan():
    kv = np.array([100, 5000, 70000, 3, 0, 20000], dtype=np.int64)
    p, _, _ = h.planner(8, 4096, 264, workspace=1 << 30)
    p.configure(2, 32, 8, 2, 264, 64, 1 << 20, 16, 4096)
    ref = s.schedule(kv, 2, 32, 8, 2, 264, 64, 1 << 20, max_items=4096)
    plan = h.plan_only(p, kv, np.zeros(6, np.int64))
    assert plan.num_part_slots == ref.num_part_slots > 0
    for f in ("items", "cta_indptr", "merge_items"):
        assert getattr(plan, f).tobytes() == getattr(ref, f).tobytes(), f
    h.plan_only(p, kv, np.zeros(6, np.int64))
    with pytest.raises(RuntimeError, match="a later plan\\(\\) has overwritten"):
        plan.items  # noqa: B018


OUT_OF_RANGE = [
    (np.array([-5, 100]), {}),  # negative length
    (np.array([2**31, 100]), {}),  # beyond int32
    (np.array([2**31 - 2**16 + 1, 100]), {}),  # within a margin of int32's end
    (np.array([5, 100]), {"alpha": 0.0}),
    (np.array([5, 100]), {"alpha": float("nan")}),
    (np.array([5, 100]), {"min_chunk": 0, "num_ctas": 1 << 20}),  # chunk 0
    (np.array([5, 100]), {"num_ctas": 0}),
    (np.array([5, 100]), {"q_len": 1 << 30}),
    (np.array([5, 100]), {"split_factors": (1, 0)}),
]


@pytest.mark.parametrize("kv,kw", OUT_OF_RANGE)
def test_inputs_beyond_the_limits_raise(kv, kw):
    p, buf, _ = h.planner(4, 64, 8)
    args = {"q_len": 1, "num_qo_heads": 32, "num_kv_heads": 8, "row_blocks": 1, "num_ctas": 8,
            "kv_tile": 64, "max_part_rows": 1 << 20, "page_size": 16, "max_items": None}  # fmt: skip
    extra = {k: kw.pop(k) for k in ("alpha", "min_chunk", "split_factors") if k in kw}
    args.update(kw)
    p.configure(*args.values(), **extra)
    with pytest.raises(ValueError, match="beyond the planner's limits") as info:
        h.plan_only(p, kv, np.zeros(kv.shape[0], np.int64))
    assert str(info.value) == decode_plan.OUT_OF_RANGE_MESSAGE
    assert (buf == SENTINEL).all()


def test_at_most_four_split_factors():
    p, _, _ = h.planner(4, 64, 8)
    with pytest.raises(ValueError, match="at most 4 split factors"):
        p.configure(1, 32, 8, 1, 8, 64, 1 << 20, 16, None, split_factors=(1, 2, 3, 4, 5))


def test_too_small_buffer_and_overlapping_regions_raise():
    kv = np.array([10, 3000], dtype=np.int64)
    lay = make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=100)
    small = np.full(lay.items + 8, SENTINEL, np.uint8)  # too short for the items
    overlapping = dataclasses.replace(lay, req_kv_len=lay.req_page_begin + 4)
    for buf, layout in (
        (small, lay),
        (np.full(lay.work_bytes(64), SENTINEL, np.uint8), overlapping),
    ):
        p = decode_plan.DecodePlanner(buf, layout)
        p.configure(1, 32, 8, 1, 8, 64, 1 << 24, 16, None)
        with pytest.raises(ValueError, match="beyond the planner's limits"):
            h.plan_only(p, kv, np.zeros(2, np.int64))
        assert (buf == SENTINEL).all()


def test_buffer_must_be_flat_uint8():
    lay = make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=16)
    for bad in (
        np.zeros(100, np.int32),
        np.zeros((10, 10), np.uint8),
        np.zeros(200, np.uint8)[::2],
    ):
        with pytest.raises(ValueError, match="writeable contiguous 1-D uint8"):
            decode_plan.DecodePlanner(bad, lay)


def test_build_failure_is_reported(monkeypatch):
    """No silent fallback: the build error (nvcc command and output) reaches the caller, on
    every call, without a second build attempt."""
    calls = []

    def fail(*args, **kwargs):
        calls.append(1)
        raise jit.BuildError("attnc: nvcc failed\n  command: nvcc -o decode_plan.so\nlog: boom")

    monkeypatch.setattr(jit, "build_module", fail)
    monkeypatch.setattr(decode_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(decode_plan_library.ONCE, "failure", None)
    lay = make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=16)
    for _ in range(2):
        with pytest.raises(decode_plan_library.PlannerUnavailable) as info:
            decode_plan.DecodePlanner(np.zeros(lay.work_bytes(64), np.uint8), lay)
        text = str(info.value)
        assert "decode_plan.cpp" in text and "command: nvcc -o decode_plan.so" in text
        assert "BuildError" in text and "boom" in text
    assert calls == [1]


def test_timing_print(capsys):
    rows = h.bench(50)
    assert len(rows) == 8 and all(us > 0 for _, us in rows)


def _broken_table(rng, trial):
    """A random page table, broken in one of several ways for most trials."""
    batch = int(rng.integers(0, 40))
    lens = rng.integers(0, 3000, batch)
    indptr = np.concatenate([[0], np.cumsum(-(-lens // 16))]).astype(np.int32)
    last = np.where(lens > 0, (lens - 1) % 16 + 1, rng.integers(-2, 20, batch)).astype(np.int32)
    ids = rng.permutation(int(indptr[-1]) + 3).astype(np.int32)
    k = trial % 8
    if k == 1 and batch:
        indptr[int(rng.integers(0, batch + 1))] += int(rng.integers(-5, 5))
    elif k == 2 and batch:
        last[int(rng.integers(0, batch))] = int(rng.integers(-3, 20))
    elif k == 3:
        last = last[: max(batch - 1, 0)]
    elif k == 4 and ids.shape[0]:
        ids[int(rng.integers(0, ids.shape[0]))] = -int(rng.integers(1, 9))
    elif k == 5:
        ids = ids[: max(int(indptr[-1]) - 1, 0)]
    elif k == 6:
        indptr = indptr[:0]
    return indptr, last, ids


def test_step_checks_and_copies_match_the_oracle():
    """The step's page-table checks against the oracle's (random valid and broken tables,
    errors worded by checks/page_table.py); a passing step writes what the oracle writes and
    copies the page ids (the CUDA calls replaced by host memcpys, the "device" ids and
    workspace in host memory)."""
    rng = np.random.default_rng(99)
    lay = make_layout(1 << 24, max_batch=32, max_items=4096, max_ctas=64, max_pages=2000)
    ws = np.full(1 << 24, SENTINEL, np.uint8)
    buf = np.full(lay.work_bytes(4096), SENTINEL, np.uint8)
    p = decode_plan.DecodePlanner(buf, lay)
    p.bind(ws.ctypes.data, ws.ctypes.data + lay.page_ids, 0)
    stage = np.zeros(1 << 16, np.uint8)
    p.set_stage(stage, stage.ctypes.data, stage.shape[0])
    args = (1, 32, 8, 1, 64, 64, lay.max_part_rows(128))
    p.configure(*args, 16, lay.max_items)
    decode_plan_library.fake_cuda(1)
    failed = set()
    try:
        for trial in range(2000):
            indptr, last, ids = _broken_table(rng, trial)
            on_device = trial % 3 == 0
            try:
                kv, max_page = s.check_page_table(indptr, last, 16, lay, ids, on_device)
                want = None
            except ValueError as exc:
                want = (type(exc), str(exc))
            ws[: lay.page_ids + 4 * 4000] = SENTINEL
            buf[:] = SENTINEL
            tables = [(a.ctypes.data, a.shape[0]) for a in (indptr, last, ids)]
            try:
                p.step(*tables, on_device, 0)
                got = None
            except ValueError as exc:
                got = (type(exc), str(exc))
                failed.add(p.result.error)
            assert got == want, trial
            if want is not None:
                assert (ws[: lay.page_ids + 4 * 4000] == SENTINEL).all()  # nothing copied
                continue
            r, nnz = p.result, int(indptr[-1])
            assert r.batch == kv.shape[0] and r.nnz == nnz and r.max_page == max_page
            assert np.array_equal(p.check(*tables, on_device), kv)
            ref = s.schedule(kv, *args, max_items=lay.max_items)
            expect = np.full_like(buf, SENTINEL)
            n = s.write_work_region(expect, lay, ref, 1, indptr[:-1], kv)
            assert r.summary.work_bytes == n and buf[:n].tobytes() == expect[:n].tobytes()
            assert ws[:n].tobytes() == expect[:n].tobytes()
            got_ids = ws[lay.page_ids : lay.page_ids + 4 * nnz].view(np.int32)
            assert np.array_equal(got_ids, ids[:nnz])
            assert (ws[lay.page_ids + 4 * nnz : lay.page_ids + 4 * nnz + 16] == SENTINEL).all()
    finally:
        decode_plan_library.fake_cuda(0)
    assert failed >= set(range(1, 10)) - {abi.PT_BATCH_CAPACITY}, failed
