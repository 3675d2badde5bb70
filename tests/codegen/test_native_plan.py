"""The C++ decode planner writes exactly the numpy scheduler's work regions and schedules."""

import dataclasses
import shutil

import numpy as np
import pytest

from attnc.runtime.build import jit, toolchain
from attnc.runtime.planning import decode_plan
from attnc.runtime.planning import decode_schedule as s

pytestmark = pytest.mark.nvcc


def _have_nvcc() -> bool:
    try:
        return shutil.which(toolchain.find_nvcc()) is not None
    except toolchain.ToolNotFound:
        return False


if not _have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

HEADS = [(32, 8), (32, 32), (32, 4)]
FIELDS = ("items", "cta_indptr", "merge_items", "num_chunks", "cost")
SENTINEL = 0xAB


@pytest.fixture(scope="module", autouse=True)
def _native(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("ATTNC_NATIVE_PLAN", raising=False)
    mp.setattr(decode_plan, "_TRIED", False)
    mp.setattr(decode_plan, "_LIB", None)
    assert decode_plan.available()
    yield
    mp.undo()


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


def _buffer(nbytes):
    return np.full(nbytes, SENTINEL, np.uint8)


def _check(kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows, *, max_items=None,
           min_chunk=None, page_dtype=np.int64, rng=None, visible=None):  # fmt: skip
    """numpy schedule + write_work_region against the native planner (both entry points).
    Returns the numpy Schedule, or the CapacityError message."""
    kv = np.asarray(kv, dtype=np.int64)
    batch = kv.shape[0]
    args = (kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows)
    mc = s.MIN_CHUNK if min_chunk is None else min_chunk
    try:
        ref = s.schedule(*args, max_items=max_items, min_chunk=min_chunk, visible=visible)
        error = None
        cap = max(ref.num_items, 1)
    except s.CapacityError as exc:
        ref, error, cap = None, str(exc), max(max_items or 1, 1)
    lay = s.make_layout(1 << 40, max_batch=max(batch, 1), max_items=cap, max_ctas=ctas,
                        max_pages=16)  # fmt: skip
    size = lay.work_bytes(cap) + 40
    page_begin = (np.arange(batch, dtype=np.int64) * 3 - 7).astype(page_dtype)
    if rng is not None and batch and rng.random() < 0.1:
        page_begin[0] = (1 << 31) + 5 if page_dtype == np.int64 else -3  # wraps like numpy
    expect = _buffer(size)
    if ref is not None:
        nbytes = s.write_work_region(expect, lay, ref, q_len, page_begin, kv)
    for with_schedule in (False, True):
        buf = _buffer(size)
        planner = decode_plan.NativePlanner.create(buf, lay)
        assert planner is not None
        call = planner.plan_with_schedule if with_schedule else planner.plan
        if error is not None:
            with pytest.raises(s.CapacityError) as info:
                call(*args, page_begin, max_items=max_items, min_chunk=mc, visible=visible)
            assert str(info.value) == error
            assert buf.tobytes() == expect.tobytes()  # nothing written
            continue
        out = call(*args, page_begin, max_items=max_items, min_chunk=mc, visible=visible)
        assert out is not None, "the native planner declined a supported input"
        summary = out[0] if with_schedule else out
        assert summary == decode_plan.PlanSummary(
            ref.num_items, ref.merge_items.shape[0], ref.merge_rows, ref.chunk_size,
            ref.num_part_slots, nbytes,
        )  # fmt: skip
        assert buf.tobytes() == expect.tobytes()
        if with_schedule:
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
    """Plans of only the KV a mask shows (``visible``), as a sliding window gives them."""
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


@pytest.mark.parametrize(
    "lengths",
    [[], [0], [0, 0, 0], [1], [1, 0, 70000, 5], [7] * 300, [2**31 - 1], [2**20] * 3],
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


def test_lazy_schedule_matches_numpy():
    kv = np.array([100, 5000, 70000, 3, 0, 20000], dtype=np.int64)
    args = (kv, 2, 32, 8, 2, 264, 64, 1 << 20)
    ref = s.schedule(*args, max_items=4096)
    lay = s.make_layout(1 << 30, max_batch=8, max_items=4096, max_ctas=264, max_pages=16)
    buf = _buffer(lay.work_bytes(4096))
    planner = decode_plan.NativePlanner.create(buf, lay)
    summary = planner.plan(*args, np.zeros(6, np.int64), max_items=4096)
    lazy = decode_plan.LazySchedule(summary, *args, 4096)
    assert isinstance(lazy, s.Schedule)
    assert "_full" not in lazy.__dict__  # nothing computed yet
    assert lazy.merge_rows == ref.merge_rows and lazy.num_items == ref.num_items
    assert lazy.num_part_slots == ref.num_part_slots > 0 and lazy.chunk_size == ref.chunk_size
    _same_schedule(lazy, ref)
    assert np.array_equal(lazy.cta_loads(), ref.cta_loads())
    with pytest.raises(AttributeError):
        lazy.no_such_field  # noqa: B018
    # With mask ranges: the lazy arrays are those of the same ranges.
    visible = (np.maximum(kv - 1000, 0), kv)
    ref = s.schedule(*args, max_items=4096, visible=visible)
    summary = planner.plan(*args, np.zeros(6, np.int64), max_items=4096, visible=visible)
    lazy = decode_plan.LazySchedule(summary, *args, 4096, visible=visible)
    _same_schedule(lazy, ref)
    assert lazy.items[:, 3].max() > 0


def _planner(batch=4, items=64):
    lay = s.make_layout(1 << 20, max_batch=batch, max_items=items, max_ctas=8, max_pages=16)
    buf = _buffer(lay.work_bytes(items))
    return decode_plan.NativePlanner.create(buf, lay), buf, lay


@pytest.mark.parametrize(
    "kv,page_begin,kw",
    [
        (np.array([-5, 100]), np.zeros(2, np.int64), {}),  # negative length
        (np.array([2**31, 100]), np.zeros(2, np.int64), {}),  # beyond int32
        (np.array([5.0, 100.0]), np.zeros(2, np.int64), {}),  # float lengths
        (np.array([5, 100], np.uint64), np.zeros(2, np.int64), {}),
        (np.array([5, 100]), np.zeros(2, np.float32), {}),
        (np.array([5, 100]), np.zeros(3, np.int64), {}),  # shapes differ
        (np.arange(5), np.zeros(5, np.int64), {}),  # batch beyond the planner's capacity
        ([5, 100], np.zeros(2, np.int64), {}),  # not an array
        (np.array([5, 100]), np.zeros(2, np.int64), {"alpha": 16}),  # int alpha
        (np.array([5, 100]), np.zeros(2, np.int64), {"alpha": 0.0}),
        (np.array([5, 100]), np.zeros(2, np.int64), {"min_chunk": 0, "num_ctas": 1 << 20}),
        (np.array([5, 100]), np.zeros(2, np.int64), {"max_part_rows": 2**70}),
        (np.array([5, 100]), np.zeros(2, np.int64), {"q_len": 1.0}),
        (np.array([5, 100]), np.zeros(2, np.int64), {"num_ctas": 0}),
    ],
)
def test_inputs_left_to_numpy(kv, page_begin, kw):
    planner, buf, _ = _planner()
    args = {"q_len": 1, "num_qo_heads": 32, "num_kv_heads": 8, "row_blocks": 1, "num_ctas": 8,
            "kv_tile": 64, "max_part_rows": 1 << 20}  # fmt: skip
    args.update(kw)
    extra = {k: args.pop(k) for k in ("alpha", "min_chunk") if k in args}
    out = planner.plan(kv, *args.values(), page_begin, **extra)
    assert out is None
    assert (buf == SENTINEL).all()


def test_too_small_buffer_left_to_numpy():
    kv = np.array([10, 3000], dtype=np.int64)
    lay = s.make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=100)
    small = _buffer(lay.items + 8)  # too short for the items: numpy's ValueError
    planner = decode_plan.NativePlanner.create(small, lay)
    assert planner.plan(kv, 1, 32, 8, 1, 8, 64, 1 << 24, np.zeros(2, np.int64)) is None
    assert (small == SENTINEL).all()
    plan = s.schedule(kv, 1, 32, 8, 1, 8, 64, 1 << 24)
    with pytest.raises(ValueError):
        s.write_work_region(small, lay, plan, 1, np.zeros(2, np.int64), kv)


def test_overlapping_regions_left_to_numpy():
    kv = np.array([10, 3000, 5], dtype=np.int64)
    lay = s.make_layout(1 << 20, max_batch=3, max_items=64, max_ctas=8, max_pages=100)
    lay = dataclasses.replace(lay, req_kv_len=lay.req_page_begin + 4)  # overlaps page begins
    buf = _buffer(lay.work_bytes(64))
    planner = decode_plan.NativePlanner.create(buf, lay)
    assert planner.plan(kv, 1, 32, 8, 1, 8, 64, 1 << 24, np.zeros(3, np.int64)) is None
    assert (buf == SENTINEL).all()


def test_buffer_must_be_flat_uint8():
    lay = s.make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=16)
    lib = decode_plan._library()
    for bad in (
        np.zeros(100, np.int32),
        np.zeros((10, 10), np.uint8),
        np.zeros(200, np.uint8)[::2],
    ):
        with pytest.raises(ValueError):
            decode_plan.NativePlanner(lib, bad, lay)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("ATTNC_NATIVE_PLAN", "0")
    planner, _, _ = _planner()
    assert planner is None
    assert not decode_plan.available()


def test_build_failure_is_silent(monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise jit.BuildError("attnc: nvcc failed (test)")

    monkeypatch.setattr(jit, "build_module", fail)
    monkeypatch.setattr(decode_plan, "_TRIED", False)
    monkeypatch.setattr(decode_plan, "_LIB", None)
    monkeypatch.delenv("ATTNC_VERBOSE", raising=False)
    assert decode_plan._library() is None
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(decode_plan, "_TRIED", False)
    monkeypatch.setenv("ATTNC_VERBOSE", "1")
    planner, _, _ = _planner()
    assert planner is None
    assert "native decode planner unavailable" in capsys.readouterr().err


def test_timing_print(capsys):
    decode_plan._bench(100)
    out = capsys.readouterr().out
    print(out)
    assert "native" in out


def _fake_cuda(fake):
    out = np.zeros(4, np.int64)
    decode_plan._library().attnc_decode_fake_cuda(fake, out.ctypes.data)


def test_step_checks_match_check_page_table():
    """The step's page-table checks against decode.check_page_table (random valid and broken
    tables); a passing step writes what the numpy path writes and copies the page ids (the
    CUDA calls replaced by host memcpys, the "device" ids and workspace in host memory)."""
    import torch

    from attnc.runtime.wrappers import decode

    rng = np.random.default_rng(99)
    lay = s.make_layout(1 << 24, max_batch=32, max_items=4096, max_ctas=64, max_pages=2000)
    ws = np.full(1 << 24, SENTINEL, np.uint8)
    buf = _buffer(lay.work_bytes(4096))
    planner = decode_plan.NativePlanner.create(buf, lay)
    planner.bind(ws.ctypes.data, ws.ctypes.data + lay.page_ids, 0)
    stage = np.zeros(1 << 16, np.uint8)
    planner.set_stage(stage, stage.ctypes.data, stage.shape[0])
    args = (1, 32, 8, 1, 64, 64, lay.max_part_rows(128))
    assert planner.configure(*args, 16, lay.max_items)
    _fake_cuda(1)
    kinds = set()
    try:
        for trial in range(2000):
            batch = int(rng.integers(0, 40))
            lens = rng.integers(0, 3000, batch)
            pages = -(-lens // 16)
            indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
            last = np.where(lens > 0, (lens - 1) % 16 + 1, rng.integers(-2, 20, batch))
            last = last.astype(np.int32)
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
            on_device = trial % 3 == 0
            try:
                ptr, kv = decode.check_page_table(
                    torch.from_numpy(indptr), torch.from_numpy(last), 16
                )
                nnz = int(ptr[-1])
                if ptr.shape[0] - 1 > lay.max_batch:
                    raise decode._batch_capacity(ptr.shape[0] - 1, lay.max_batch)
                if nnz > lay.max_pages:
                    raise decode._page_capacity(nnz, lay.max_pages)
                if ids.shape[0] < nnz:
                    raise decode._indices_short(ids.shape[0], nnz)
                if nnz and not on_device and ids[:nnz].min() < 0:
                    raise decode._index_negative(int(ids[:nnz].min()))
                want = None
            except ValueError as exc:
                want = (type(exc), str(exc))
            ws[: lay.page_ids + 4 * 4000] = SENTINEL
            buf[:] = SENTINEL
            rc = planner.step(
                indptr.ctypes.data, indptr.shape[0], last.ctypes.data, last.shape[0],
                ids.ctypes.data, ids.shape[0], on_device, 0,
            )  # fmt: skip
            r = planner.result
            if want is not None:
                assert rc == decode_plan.INVALID, (trial, want)
                err = decode._page_table_error(r, 16, lay)
                assert (type(err), str(err)) == want, trial
                kinds.add(r.error)
                assert (ws[: lay.page_ids + 4 * 4000] == SENTINEL).all()  # nothing copied
                continue
            assert rc == decode_plan.OK, trial
            assert r.batch == kv.shape[0] and r.nnz == nnz
            assert np.array_equal(planner.kv_lens(r.batch), kv)
            assert np.array_equal(planner.page_begin(r.batch), ptr[:-1])
            hi = int(ids[:nnz].max()) if nnz and not on_device else -1
            assert r.max_page == hi
            ref = s.schedule(kv, *args, max_items=lay.max_items)
            expect = _buffer(buf.shape[0])
            n = s.write_work_region(expect, lay, ref, 1, ptr[:-1], kv)
            assert r.summary.work_bytes == n and buf[:n].tobytes() == expect[:n].tobytes()
            assert ws[:n].tobytes() == expect[:n].tobytes()
            got = ws[lay.page_ids : lay.page_ids + 4 * nnz].view(np.int32)
            assert np.array_equal(got, ids[:nnz])
            assert (ws[lay.page_ids + 4 * nnz : lay.page_ids + 4 * nnz + 16] == SENTINEL).all()
    finally:
        _fake_cuda(0)
    assert kinds >= set(range(1, 10)) - {decode_plan.ERR_BATCH_CAPACITY}, kinds
