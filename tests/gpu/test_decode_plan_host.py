"""decode plan()'s host side on the GPU: the page-status read only after launches (a plan
without a run since the last read does not wait for the GPU; a run, or a CUDA graph replay
of a captured run, makes the next plan() wait and report), host page ids staged in one
pass (the same work lists and outputs as device-resident ids), and plan-time mask spans from
the mask's range rows (the same items as the numpy spans, repeated values on the fast path;
per-request windows on the checked path).
Timing lives in benchmarks/decode_plan_time.py."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from mask_ranges_oracle import decode_spans, tile_kv_ranges

import attnc
from attnc.runtime.planning.decode_plan import DecodePlanner
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D, PAGE = 32, 8, 128, 16
LENGTHS = [4096, 300, 17, 2049, 0, 9000, 64, 1000]
SLEEP_CYCLES = 400_000_000  # ~0.2 s of one SM's clock: far longer than a plan


def _table(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in LENGTHS]
    num_pages = sum(pages) + 3
    indptr = torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32)
    ids = torch.randperm(num_pages, generator=g).to(torch.int32)[: int(indptr[-1])].contiguous()
    last = torch.tensor([(n - 1) % PAGE + 1 if n else 1 for n in LENGTHS], dtype=torch.int32)
    cache = torch.randn((num_pages, 2, PAGE, HKV, D), generator=g).bfloat16().cuda()
    q = torch.randn((len(LENGTHS), HQ, D), generator=g).bfloat16().cuda()
    return indptr, ids, last, cache, q


def _wrapper(name: str = "causal", **kw) -> BatchDecodeWrapper:
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    return BatchDecodeWrapper(attnc.load(f"stdlib:{name}"), ws, **kw)


def _plan(w, indptr, ids, last, **kw) -> float:
    """Seconds plan() took."""
    t = time.perf_counter()
    w.plan(indptr, ids, last, HQ, HKV, D, PAGE, **kw)
    return time.perf_counter() - t


def _sleep_ms() -> float:
    """Milliseconds SLEEP_CYCLES of torch.cuda._sleep take on this GPU."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def test_plan_waits_for_the_gpu_only_after_a_run():
    indptr, ids, last, cache, q = _table()
    dev_ids = ids.cuda()
    w = _wrapper()
    _plan(w, indptr, dev_ids, last)
    sleep_ms = _sleep_ms()
    assert sleep_ms > 50, sleep_ms
    torch.cuda._sleep(SLEEP_CYCLES)  # the GPU is busy; nothing of w ran since the plan
    assert _plan(w, indptr, dev_ids, last) * 1e3 < sleep_ms / 4
    torch.cuda.synchronize()
    w.run(q, cache)
    torch.cuda._sleep(SLEEP_CYCLES)  # a run since the plan: the next one reads the word
    assert _plan(w, indptr, dev_ids, last) * 1e3 > sleep_ms / 2
    torch.cuda._sleep(SLEEP_CYCLES)  # read once per run: no wait now
    assert _plan(w, indptr, dev_ids, last) * 1e3 < sleep_ms / 4
    torch.cuda.synchronize()


def test_graph_replays_are_reported_by_the_next_plan():
    """Replays launch without passing through run(): a CUDA-graph wrapper reads the word at
    every plan() once it has launched."""
    indptr, ids, last, cache, q = _table(1)
    w = _wrapper(use_cuda_graph=True)
    _plan(w, indptr, ids.cuda(), last)
    out = torch.empty_like(q)
    w.run(q, cache, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out)
    bad = ids.clone()
    bad[int(indptr[5]) + 2] = 1 << 30  # request 5's third page
    _plan(w, indptr, bad.cuda(), last)
    _plan(w, indptr, bad.cuda(), last)  # no replay yet: nothing to report
    graph.replay()
    with pytest.raises(ValueError, match=r"kv_indices: request 5 uses page id 1073741824\b"):
        _plan(w, indptr, ids.cuda(), last)


def test_host_and_device_page_ids_give_the_same_step():
    indptr, ids, last, cache, q = _table(2)
    outs, items = [], []
    for page_ids in (ids, ids.cuda(), ids, ids.cuda()):  # checked path, then the fast path
        w = _wrapper()
        for _ in range(2):
            _plan(w, indptr, page_ids, last)
        items.append(w.last_schedule.items)
        outs.append(w.run(q, cache))
    torch.cuda.synchronize()
    for got_items, got in zip(items[1:], outs[1:], strict=True):
        assert (got_items == items[0]).all()
        assert torch.equal(got, outs[0])


def _numpy_spans_step(monkeypatch, ranges) -> None:
    """Make every DecodePlanner step plan the numpy spans of ``ranges`` (mask_ranges_oracle
    decode_spans of the checked KV lengths) instead of evaluating the range rows."""
    real_step = DecodePlanner.step

    def step(self, indptr, last, indices, on_device, stream, indptr_checked=False):
        kv = self.check(indptr, last, indices, on_device, indptr_checked)
        plan = self._step.plan
        self.set_ranges(None)
        self.set_visible(decode_spans(ranges, kv, int(plan.q_len), int(plan.kv_tile)))
        return real_step(self, indptr, last, indices, on_device, stream, indptr_checked)

    monkeypatch.setattr(DecodePlanner, "step", step)


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm"])
def test_range_row_plans_match_the_numpy_spans(name, monkeypatch):
    """The step's spans (range rows) against the numpy spans: the same items and
    bit-identical outputs; the second plan with the same value takes the fast path."""
    indptr, ids, last, cache, q = _table(3)
    key = "window" if name == "sliding_window" else "prefix_len"
    params = {key: 700}
    w = _wrapper(name)
    _plan(w, indptr, ids, last, params=params)
    _plan(w, indptr, ids, last, params=params)
    assert w._fast is not None and w._fast.program is not None  # the fast path
    items, o = w.last_schedule.items, w.run(q, cache, **params)
    _numpy_spans_step(monkeypatch, tile_kv_ranges(w.variant.compiled.mask_analysis, params))
    ref = _wrapper(name)
    _plan(ref, indptr, ids, last, params=params)
    assert (ref.last_schedule.items == items).all()
    assert torch.equal(ref.run(q, cache, **params), o)


def test_per_request_window_plans_match_the_numpy_spans(monkeypatch):
    """window[batch]: the rows' extra column of the windows gives the numpy spans' items and
    bit-identical outputs (the checked path on every plan)."""
    indptr, ids, last, cache, q = _table(4)
    window = torch.tensor([700, 5, 64, 4096, 1, 300, 2, 9000], dtype=torch.int32)
    params = {"window": window.cuda()}
    w = _wrapper("per_request_window")
    _plan(w, indptr, ids, last, params=params)
    assert w._fast is None
    items, o = w.last_schedule.items, w.run(q, cache, **params)
    assert (items[:, 3] > 0).any()  # the windows narrowed some request
    analysis = w.variant.compiled.mask_analysis
    ranges = tile_kv_ranges(analysis, {}, {"window": window.numpy().astype("int64")})
    _numpy_spans_step(monkeypatch, ranges)
    ref = _wrapper("per_request_window")
    _plan(ref, indptr, ids, last, params=params)
    assert (ref.last_schedule.items == items).all()
    assert torch.equal(ref.run(q, cache, **params), o)
