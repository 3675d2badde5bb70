"""The device page-id check: a page id outside ``[0, num_pages)`` that reaches a kernel (decode
with device-resident ``kv_indices``; paged prefill with a corrupted workspace copy of its page
table) is never read -- the process's CUDA context survives --, the rows of the requests that
met it are NaN (O and LSE), the other requests' rows match the float64 reference (accuracy
rule of test_decode.py / test_prefill.py), ``check()`` or the next decode ``plan()`` raises a
``ValueError`` naming ``kv_indices``, the request and the id, and a later good step is right.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import attnc
from attnc.runtime.checks import page_status
from attnc.runtime.planning import decode_plan
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 16, 4, 128
PAGE = 16
ERR_FACTOR, ERR_FLOOR = 3.0, 2e-4
LENGTHS = [300, 16000, 17, 2049, 64]  # request 1 (the bad one) is long enough to split
BAD_REQUEST = 1
# Both prefill templates: FA2, and the Hopper one on sm_90 (it zero-filled the rows of a bad
# page id and wrote finite rows before its items were poisoned like FA2's).
PREFILL_BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class PagedBatch:
    """Requests in a shuffled NHD cache ``[pages, 2, PAGE, HKV, D]`` (a few spare pages)."""

    def __init__(self, kv_lens: list[int], q_len: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.kv_lens, self.q_len = kv_lens, q_len
        pages = [-(-n // PAGE) for n in kv_lens]
        self.num_pages = sum(pages) + 3
        perm = torch.randperm(self.num_pages, generator=g).to(torch.int32)
        self.cache = torch.randn((self.num_pages, 2, PAGE, HKV, D), generator=g).bfloat16().cuda()
        self.kv_indptr = torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32)
        self.kv_indices = perm[: int(self.kv_indptr[-1])].contiguous()
        self.last = torch.tensor([(n - 1) % PAGE + 1 for n in kv_lens], dtype=torch.int32)
        self.q = torch.randn((len(kv_lens) * q_len, HQ, D), generator=g).bfloat16().cuda()

    def kv_of(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.kv_indices[self.kv_indptr[i] : self.kv_indptr[i + 1]].long().cuda()
        blocks = self.cache[ids]
        k = blocks[:, 0].reshape(-1, HKV, D)[: self.kv_lens[i]]
        v = blocks[:, 1].reshape(-1, HKV, D)[: self.kv_lens[i]]
        return k, v

    def bad_indices(self, request: int, bad_id: int) -> torch.Tensor:
        """The page table with the request's fourth page (or its last) replaced by bad_id."""
        ids = self.kv_indices.clone()
        start, end = int(self.kv_indptr[request]), int(self.kv_indptr[request + 1])
        ids[min(start + 3, end - 1)] = bad_id
        return ids

    def check_rows(self, variant, o, lse, bad: set[int], q_rows: list[tuple[int, int]], **params):
        """Bad requests' rows NaN; the others against the float64 reference."""
        for i, (s, e) in enumerate(q_rows):
            if i in bad:
                assert torch.isnan(o[s:e]).all(), f"request {i}: rows not NaN"
                assert torch.isnan(lse[s:e]).all(), f"request {i}: LSE not NaN"
                continue
            k, v = self.kv_of(i)
            q = self.q[s:e]
            ref, ref_lse = variant.reference(
                q.double(), k.double(), v.double(), return_lse=True, **params
            )
            eager = variant.reference(q, k, v, **params)
            err, bound = _rel(o[s:e], ref), ERR_FACTOR * _rel(eager, ref) + ERR_FLOOR
            assert err <= bound, f"request {i}: error {err:.3g} > {bound:.3g}"
            torch.testing.assert_close(lse[s:e].double(), ref_lse, atol=2e-2, rtol=1e-3)


def _decode_rows(batch: PagedBatch) -> list[tuple[int, int]]:
    n = batch.q_len
    return [(i * n, (i + 1) * n) for i in range(len(batch.kv_lens))]


def _decode_wrapper(variant, **kw) -> BatchDecodeWrapper:
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    return BatchDecodeWrapper(variant, ws, **kw)


def _plan_decode(w: BatchDecodeWrapper, batch: PagedBatch, indices: torch.Tensor) -> None:
    w.plan(batch.kv_indptr, indices, batch.last, HQ, HKV, D, PAGE, q_len_per_request=batch.q_len)


@pytest.mark.parametrize("kind", ["past_the_pool", "negative"])
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_bad_device_page_id(kind, split, q_len, monkeypatch):
    if not split:
        monkeypatch.setattr(decode_plan, "MIN_CHUNK", 1 << 30)
    variant = attnc.load("stdlib:causal")
    batch = PagedBatch(LENGTHS, q_len, seed=q_len)
    bad_id = batch.num_pages + 1000 if kind == "past_the_pool" else -7
    w = _decode_wrapper(variant)
    _plan_decode(w, batch, batch.bad_indices(BAD_REQUEST, bad_id).cuda())
    items = w.last_schedule.items
    assert (items[items[:, 0] == BAD_REQUEST][:, 5].max() >= 0) == split  # split: merged
    o, lse = w.run(batch.q, batch.cache, return_lse=True)
    torch.cuda.synchronize()  # no illegal memory access
    batch.check_rows(variant, o, lse, {BAD_REQUEST}, _decode_rows(batch))
    with pytest.raises(
        ValueError, match=rf"kv_indices: request {BAD_REQUEST} uses page id {bad_id}\b"
    ):
        w.check()
    w.check()  # reported once, then clear

    # The next plan() reports a bad run of the previous step before planning.
    w.run(batch.q, batch.cache)
    with pytest.raises(ValueError, match=rf"request {BAD_REQUEST} uses page id {bad_id}\b"):
        _plan_decode(w, batch, batch.kv_indices.cuda())
    _plan_decode(w, batch, batch.kv_indices.cuda())
    o, lse = w.run(batch.q, batch.cache, return_lse=True)
    batch.check_rows(variant, o, lse, set(), _decode_rows(batch))
    _plan_decode(w, batch, batch.kv_indices.cuda())  # nothing to report
    torch.cuda.synchronize()


def test_decode_lowest_bad_request_is_named_and_all_bad_rows_are_nan():
    """Requests 2 and 3 have bad ids in pages the window shows: both NaN, 2 is named. Request
    1's bad id sits in a page the window hides: never read, so its rows are right."""
    variant = attnc.load("stdlib:sliding_window")
    batch = PagedBatch(LENGTHS, 1, seed=5)
    ids = batch.kv_indices.clone()
    ids[int(batch.kv_indptr[1])] = -1  # request 1's first page: outside the window
    ids[int(batch.kv_indptr[3]) - 1] = batch.num_pages  # request 2's last page: one past
    ids[int(batch.kv_indptr[4]) - 1] = -5  # request 3's last page
    w = _decode_wrapper(variant)
    _plan_decode(w, batch, ids.cuda())
    o, lse = w.run(batch.q, batch.cache, return_lse=True, window=700)
    batch.check_rows(variant, o, lse, {2, 3}, _decode_rows(batch), window=700)
    with pytest.raises(ValueError, match=rf"request 2 uses page id {batch.num_pages}\b"):
        w.check()


def test_decode_cuda_graph_replay_reports(monkeypatch):
    variant = attnc.load("stdlib:causal")
    batch = PagedBatch(LENGTHS, 1, seed=7)
    w = _decode_wrapper(variant, use_cuda_graph=True)
    _plan_decode(w, batch, batch.kv_indices.cuda())
    out = torch.empty_like(batch.q)
    w.run(batch.q, batch.cache, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(batch.q, batch.cache, out=out)
    _plan_decode(w, batch, batch.bad_indices(2, 1 << 30).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[2]).all() and not torch.isnan(out[:2]).any()
    with pytest.raises(ValueError, match=r"request 2 uses page id 1073741824\b"):
        w.check()


def test_decode_debug_mode_raises_at_run(monkeypatch):
    monkeypatch.setenv(page_status.DEBUG_ENV, "1")
    variant = attnc.load("stdlib:causal")
    batch = PagedBatch(LENGTHS, 1, seed=9)
    w = _decode_wrapper(variant)
    _plan_decode(w, batch, batch.bad_indices(4, -100).cuda())
    with pytest.raises(ValueError, match=r"request 4 uses page id -100\b"):
        w.run(batch.q, batch.cache)
    _plan_decode(w, batch, batch.kv_indices.cuda())
    o, lse = w.run(batch.q, batch.cache, return_lse=True)  # no error: it runs clean
    batch.check_rows(variant, o, lse, set(), _decode_rows(batch))


def _plan_prefill(w: BatchPrefillWrapper, batch: PagedBatch, q_lens: list[int]) -> list[int]:
    qo = [0, *itertools.accumulate(q_lens)]
    w.plan(
        torch.tensor(qo, dtype=torch.int32), batch.kv_indptr, HQ, HKV, D,
        kv_indices=batch.kv_indices, kv_last_page_len=batch.last, page_size=PAGE,
        dtype=torch.bfloat16,
    )  # fmt: skip
    return qo


def _corrupt_prefill_page(w: BatchPrefillWrapper, batch: PagedBatch, request: int, bad: int):
    """Overwrite one page id of the plan's device copy of the page table (the host checked
    the ids at plan(): only a corrupted or device-updated table reaches the kernel)."""
    plan = w._plan
    assert plan is not None
    pos = min(int(batch.kv_indptr[request]) + 3, int(batch.kv_indptr[request + 1]) - 1)
    off = plan.layout.offsets["kv_indices"] + 4 * pos
    w._workspace[off : off + 4].copy_(torch.tensor([bad], dtype=torch.int32).view(torch.uint8))


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
@pytest.mark.parametrize("kind", ["past_the_pool", "negative"])
@pytest.mark.parametrize("q_len", [1, 37, 300])
def test_prefill_bad_page_id(kind, q_len, backend, monkeypatch):
    """q_len 1 and 37 split the long requests' KV (merge kernel path); 300 mostly does not."""
    variant = attnc.load("stdlib:causal")
    kv_lens = [max(n, q_len) for n in LENGTHS]
    batch = PagedBatch(kv_lens, q_len, seed=q_len)
    q_lens = [q_len] * len(kv_lens)
    bad_id = batch.num_pages if kind == "past_the_pool" else -(2**31)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend)
    qo = _plan_prefill(w, batch, q_lens)
    _corrupt_prefill_page(w, batch, BAD_REQUEST, bad_id)
    o, lse = w.run(batch.q, batch.cache, return_lse=True)
    torch.cuda.synchronize()
    rows = list(zip(qo[:-1], qo[1:], strict=True))
    batch.check_rows(variant, o, lse, {BAD_REQUEST}, rows)
    with pytest.raises(
        ValueError, match=rf"kv_indices: request {BAD_REQUEST} uses page id {bad_id}\b"
    ):
        w.check()
    w.check()
    _plan_prefill(w, batch, q_lens)  # a new plan copies the good table again
    o, lse = w.run(batch.q, batch.cache, return_lse=True)
    batch.check_rows(variant, o, lse, set(), rows)
    w.check()


def test_prefill_debug_mode_raises_at_run(monkeypatch):
    monkeypatch.setenv(page_status.DEBUG_ENV, "1")
    variant = attnc.load("stdlib:vanilla")
    batch = PagedBatch(LENGTHS, 4, seed=11)
    w = BatchPrefillWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    _plan_prefill(w, batch, [4] * len(LENGTHS))
    _corrupt_prefill_page(w, batch, 0, batch.num_pages + 5)
    with pytest.raises(ValueError, match=rf"request 0 uses page id {batch.num_pages + 5}\b"):
        w.run(batch.q, batch.cache)
