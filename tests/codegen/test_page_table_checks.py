"""Which error wins when several parts of a batch description are wrong at once: the prefill
planner's check (``prefill_batch.checked_batch``) raises what the Python checks
(``prefill_batch.check_indices``) raise, and the decode planner's page-table check and step
raise what the oracle (``decode_schedule_oracle.check_page_table``) raises, on random tables
with several faults each, requests near the kernels' token limit among them."""

from __future__ import annotations

import decode_plan_harness as h
import decode_schedule_oracle as oracle
import numpy as np
import pytest
import torch

from attnc.runtime.planning import decode_plan_library
from attnc.runtime.planning.prefill_planner import PrefillPlanner
from attnc.runtime.wrappers import prefill_batch

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

I32_MAX = 2**31 - 1
LIMIT = 2**31 - 2**16  # MAX_QUERY_TOKENS == MAX_KV_TOKENS
PAGE_SIZES = [1, 5, 16, 2**16, I32_MAX]


def _lengths(rng, n: int) -> np.ndarray:
    """Mostly short lengths, some within 2 of the token limit."""
    v = rng.integers(0, 40, n)
    near = rng.random(n) < 0.15
    v[near] = LIMIT - 2 + rng.integers(0, 5, int(near.sum()))
    return v


def _indptr(lens: np.ndarray) -> np.ndarray:
    """Prefix sums from 0, clipped into int32 (a clipped run is flat: not a fault)."""
    return np.minimum(np.concatenate([[0], np.cumsum(lens)]), I32_MAX)


def _break_indptr(rng, v: np.ndarray) -> np.ndarray:
    """``v`` with a fault now and then: a wrong start, a drop, or no entries."""
    v = v.copy()
    kind = rng.integers(8)
    if kind == 0 and v.shape[0]:
        v[0] = rng.integers(1, 4)
    elif kind == 1 and v.shape[0] > 1:
        v[int(rng.integers(1, v.shape[0]))] -= int(rng.integers(1, 5))
    elif kind == 2:
        v = v[:0]
    return v


def _last(rng, pages: np.ndarray, page: int) -> np.ndarray:
    """Last-page lengths, in [1, page] for most requests with pages (1 or 2 for the largest
    page: requests past the KV limit that tie, where the first of the longest is named)."""
    last = rng.integers(1, (2 if page == I32_MAX else min(page, 40)) + 1, pages.shape[0])
    bad = rng.random(pages.shape[0]) < 0.1
    last[bad] = rng.choice([-1, 0, page + 1 if page < I32_MAX else 0], int(bad.sum()))
    return last


def _resize(rng, v: np.ndarray, n: int) -> np.ndarray:
    """``v`` with ``n`` entries, or one fewer or more now and then."""
    n = max(n + int(rng.choice([0, 0, 0, 0, -1, 1])), 0)
    return np.resize(v, n) if v.shape[0] else np.zeros(n, np.int64)


def _paged(rng, batch: int):
    """(kv_indptr, kv_indices, kv_last_page_len, page_size), each possibly faulty."""
    page = int(rng.choice(PAGE_SIZES))
    pages = rng.integers(0, 4, batch)
    kv = _break_indptr(rng, _indptr(pages))
    nnz = int(kv[-1]) if kv.shape[0] else 0
    ids = rng.integers(0, 60, max(nnz, 0) + int(rng.integers(0, 3)))
    if ids.shape[0] and rng.random() < 0.2:
        ids[int(rng.integers(0, ids.shape[0]))] = -int(rng.integers(1, 4))
    if rng.random() < 0.15:
        ids = ids[: max(nnz - 1, 0)]
    last = _resize(rng, _last(rng, pages, page), batch)
    return kv, ids, last, page


def _prefill_args(rng):
    batch = int(rng.integers(0, 5))
    qo = _break_indptr(rng, _indptr(_lengths(rng, batch)))
    if rng.random() < 0.4:
        kv = _break_indptr(rng, _indptr(_lengths(rng, batch)))
        tables = (kv, None, None, None)
    else:
        tables = _paged(rng, batch)
    if rng.random() < 0.1:  # kv_indptr with another number of entries than qo_indptr
        tables = (_resize(rng, tables[0], tables[0].shape[0] + 1), *tables[1:])

    def i32(v):
        return None if v is None else torch.from_numpy(np.asarray(v, np.int64)).to(torch.int32)

    return (i32(qo), *(i32(t) for t in tables[:3]), tables[3])


PHRASES = (
    "at least one",
    "start at 0",
    "non-decreasing",
    "entries, qo",
    "pages of",
    "limit",
    "negative",
    "kv_indptr[-1]",
    "expected",
    "outside",
    "max_batch_size",
    "capacity",
)
PREFILL_KINDS = {
    "qo_indptr: at least one", "qo_indptr: start at 0", "qo_indptr: non-decreasing",
    "qo_indptr: limit", "kv_indptr: at least one", "kv_indptr: start at 0",
    "kv_indptr: non-decreasing", "kv_indptr: entries, qo", "kv_indptr: limit",
    "kv_indptr: pages of", "kv_indices: negative", "kv_indices: kv_indptr[-1]",
    "kv_last_page_len: expected", "kv_last_page_len: outside",
}  # fmt: skip
DECODE_KINDS = {
    "kv_indptr: at least one", "kv_indptr: start at 0", "kv_indptr: non-decreasing",
    "kv_last_page_len: expected", "kv_last_page_len: outside", "kv_indptr: max_batch_size",
    "kv_indices: capacity", "kv_indices: kv_indptr[-1]", "kv_indices: negative",
}  # fmt: skip


def _kind(message: str) -> str:
    """The table a message names and the first of ``PHRASES`` in it."""
    return f"{message.split(' ')[0]} {next(p for p in PHRASES if p in message)}"


def _error(fn, *args) -> tuple[type, str] | None:
    try:
        fn(*args)
    except ValueError as exc:
        return type(exc), str(exc)
    return None


def test_prefill_check_raises_what_the_python_checks_raise():
    rng = np.random.default_rng(7)
    planner = PrefillPlanner()
    errors = set()
    for trial in range(3000):
        args = _prefill_args(rng)
        want = _error(prefill_batch.check_indices, *args)
        got = _error(prefill_batch.checked_batch, planner, *args)
        assert got == want, (trial, args)
        if want is not None:
            errors.add(_kind(want[1]))
    assert errors == PREFILL_KINDS, errors ^ PREFILL_KINDS


def _decode_table(rng):
    batch = int(rng.integers(0, 40))
    kv, ids, last, page = _paged(rng, batch)
    clip = lambda v: np.asarray(v, np.int64).clip(-(2**31), I32_MAX).astype(np.int32)  # noqa: E731
    return clip(kv), clip(last), clip(ids), page


def test_decode_checks_raise_what_the_oracle_raises():
    rng = np.random.default_rng(11)
    p, _, lay = h.planner(32, 4096, 64, workspace=1 << 24, max_pages=30)
    stage = np.zeros(1 << 12, np.uint8)
    p.set_stage(stage, stage.ctypes.data, stage.shape[0])
    decode_plan_library.fake_cuda(1)
    errors = set()
    try:
        for trial in range(3000):
            indptr, last, ids, page = _decode_table(rng)
            p.configure(1, 32, 8, 1, 64, 64, lay.max_part_rows(128), page, lay.max_items)
            on_device = trial % 3 == 0
            want = _error(oracle.check_page_table, indptr, last, page, lay, ids, on_device)
            tables = [(a.ctypes.data, a.shape[0]) for a in (indptr, last, ids)]
            assert _error(p.check, *tables, on_device) == want, trial
            if want is not None:
                assert _error(p.step, *tables, on_device, 0) == want, trial
                errors.add(_kind(want[1]))
    finally:
        decode_plan_library.fake_cuda(0)
    assert errors == DECODE_KINDS, errors ^ DECODE_KINDS
