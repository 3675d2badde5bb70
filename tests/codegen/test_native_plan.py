"""The C++ decode planner gives exactly the numpy scheduler's schedules and work regions."""

import shutil

import numpy as np
import pytest

from attnc.runtime import native_plan, toolchain
from attnc.runtime import scheduler as s

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


@pytest.fixture(scope="module", autouse=True)
def _native(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("ATTNC_NATIVE_PLAN", raising=False)
    mp.setattr(native_plan, "_TRIED", False)
    mp.setattr(native_plan, "_LIB", None)
    assert native_plan.available()
    yield
    mp.undo()


def _lengths(rng, batch):
    kind = rng.integers(4)
    if kind == 0:
        return rng.integers(1, 32769, batch)
    if kind == 1:  # skewed: mostly short, a few long
        short = rng.integers(1, 512, batch)
        return np.where(rng.random(batch) < 0.1, rng.integers(8192, 32769, batch), short)
    if kind == 2:  # zipf as in the anchors, shuffled
        z = [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(batch)]
        return rng.permutation(np.array(z))
    return np.minimum(32768, rng.zipf(1.3, batch) * int(rng.integers(1, 64)))


def _same(a, b):
    assert type(a) is type(b)
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert x.tobytes() == y.tobytes(), f
    for f in ("chunk_size", "num_part_slots", "merge_rows"):
        x, y = getattr(a, f), getattr(b, f)
        assert type(x) is type(y) and x == y, f


def _both(*args, **kw):
    outcome = []
    for impl in (s, native_plan):
        try:
            outcome.append(impl.schedule(*args, **kw))
        except s.CapacityError as exc:
            outcome.append(str(exc))
    if isinstance(outcome[0], str):
        assert outcome[1] == outcome[0]
        return None
    _same(outcome[0], outcome[1])
    return outcome[1]


def _region(plan, kv, q_len, page_dtype=np.int32):
    lay = s.make_layout(1 << 22, max_batch=max(len(kv), 1), max_items=max(plan.num_items, 1),
                        max_ctas=len(plan.cta_indptr) - 1, max_pages=1000)  # fmt: skip
    page_begin = np.arange(len(kv), dtype=page_dtype) * 3
    out = []
    for impl in (s, native_plan):
        buf = np.full(lay.page_ids, 0xAB, np.uint8)
        n = impl.write_work_region(buf, lay, plan, q_len, page_begin, kv)
        out.append((n, buf))
    assert out[0][0] == out[1][0]
    assert out[0][1].tobytes() == out[1][1].tobytes()


class _NoFallback:
    def __getattr__(self, name):
        raise AssertionError(f"the native planner fell back to numpy ({name})")


def test_random_workloads_identical(monkeypatch):
    monkeypatch.setattr(native_plan, "_numpy_plan", _NoFallback())
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
        full = _both(kv, q_len, hq, hkv, row_blocks, ctas, tile, 1 << 40)
        assert full is not None
        part_rows = 1 << 24
        if full.num_part_slots and rng.random() < 0.5:
            # Fewer partial rows than the first chunk wants: the doubling loop runs.
            part_rows = int(full.num_part_slots * q_len * hq * rng.uniform(0.0, 0.9))
        max_items = None
        if rng.random() < 0.2:
            max_items = int(full.num_items * rng.uniform(0.5, 1.2))
        plan = _both(kv, q_len, hq, hkv, row_blocks, ctas, tile, part_rows, max_items=max_items)
        if plan is None:
            capacity_errors += 1
            continue
        doubled += plan.chunk_size > full.chunk_size > 0
        split += plan.num_part_slots > 0
        if trial % 10 == 0:
            _region(plan, kv, q_len, np.int32 if trial % 20 else np.int64)
    assert capacity_errors > 50 and doubled > 50 and split > 500, (capacity_errors, doubled, split)


@pytest.mark.parametrize(
    "lengths",
    [[], [0], [0, 0, 0], [1], [1, 0, 70000, 5], [7] * 300, [2**31 - 1], [2**20] * 3],
)
def test_edge_lengths(lengths):
    kv = np.asarray(lengths, dtype=np.int64)
    for min_chunk in (None, 1, 64, 1 << 20):
        for ctas in (1, 264):
            plan = _both(kv, 1, 32, 8, 1, ctas, 64, 1 << 24, min_chunk=min_chunk)
            _region(plan, kv, 1)


def test_parameters_the_native_code_leaves_to_numpy():
    kv = np.array([100, 5000, 70000], dtype=np.int64)
    _both(kv, 1, 32, 8, 1, 264, 64, 1 << 24, alpha=16)  # int alpha: int64 costs in numpy
    _both(kv, 1, 32, 8, 1, 264, 64, 1 << 24, alpha=0.0, beta=2.5)
    _both(kv, 1, 32, 8, 1, 264, 64, 2**70)  # beyond int64
    _both(np.array([-5, 100]), 1, 32, 8, 1, 264, 64, 1 << 24)  # negative length
    _both(kv.tolist(), np.int64(2), 32, 8, 1, 264, 64, 1 << 24)  # list, numpy q_len
    _both(kv[::-1], 1, 32, 8, 1, 264, 64, 1 << 24)  # non-contiguous


def test_unsorted_search_matches_numpy():
    lib = native_plan._library()
    rng = np.random.default_rng(7)
    for _ in range(500):
        n, ctas = int(rng.integers(0, 60)), int(rng.integers(0, 40))
        cta = rng.integers(-3, ctas + 3, n).astype(np.int64)
        if rng.random() < 0.5:
            cta.sort()
        out = np.empty(ctas + 1, np.int32)
        lib.attnc_plan_searchsorted(cta, n, ctas, int(bool((np.diff(cta) >= 0).all())), out)
        assert out.tolist() == np.searchsorted(cta, np.arange(ctas + 1)).tolist()


def test_write_falls_back_on_bad_buffers():
    kv = np.array([10, 3000], dtype=np.int64)
    plan = native_plan.schedule(kv, 1, 32, 8, 1, 8, 64, 1 << 24)
    lay = s.make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=100)
    small = np.zeros(lay.items + 8, np.uint8)  # too short for the items: numpy's error
    with pytest.raises(ValueError):
        native_plan.write_work_region(small, lay, plan, 1, np.array([0, 1]), kv)
    with pytest.raises(ValueError):
        s.write_work_region(small.copy(), lay, plan, 1, np.array([0, 1]), kv)


def test_timing_print(capsys):
    native_plan._bench(200)
    out = capsys.readouterr().out
    print(out)
    assert "native" in out
