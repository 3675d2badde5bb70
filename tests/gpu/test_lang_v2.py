"""Language v2 on the GPU: per-token and per-request tensors and sinks through
``BatchPrefillWrapper`` (ragged and paged, both templates), ``Variant.prefill`` (a tile map per
call), ``BatchDecodeWrapper``, the device-built tile map against brute force, and CUDA-graph
replay after a re-plan with a new map, all against the float64 reference.

Accuracy rule as in test_prefill.py: ||o - ref64|| / ||ref64|| <= 3 * eager + 2e-4, where
``eager`` is the same error of the reference run in the kernel's dtype.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from batch_check import check_batch, plan_and_run
from batch_check import check_request as _check
from batch_check import paged_cache as _paged
from tile_map_oracle import doc_causal_map

import attnc
from attnc.runtime.wrappers import prefill_launch
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

SOURCES = {
    "doc_causal": """variant doc_causal {
        doc "packed documents: causal inside each document";
        param doc: tensor<i32>[kv_len];
        mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
    }""",
    "per_request_window": """variant per_request_window {
        param window: tensor<i32>[batch_size];
        mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];
    }""",
    "gpt_oss_local": """variant gpt_oss_local {
        param sinks: tensor<f32>[num_qo_heads];
        param window: i32 = 128;
        sink = sinks[qo_head];
        mask = kv_idx <= q_pos && q_pos - kv_idx < window;
    }""",
}
HQ, HKV, D = 8, 2, 128
Q_LENS, KV_LENS = [17, 1, 577, 300, 64], [17, 300, 1200, 300, 2049]
WORKSPACE = 64 << 20


def _variant(name):
    return attnc.load(source=SOURCES[name])


def _documents(kv_lens, gen):
    """Random document ids per request (a few cuts each), flattened over the batch."""
    parts = []
    for n in kv_lens:
        cuts = torch.randint(0, max(n, 1), (3,), generator=gen)
        ids = torch.zeros(n, dtype=torch.int32)
        for c in cuts.tolist():
            ids[c:] += 1
        parts.append(ids)
    return torch.cat(parts).cuda()


def _params(name, kv_lens, gen):
    """(batch params, params of request i) for a variant."""
    starts = [0, *itertools.accumulate(kv_lens)]
    if name == "doc_causal":
        doc = _documents(kv_lens, gen)
        return {"doc": doc}, lambda i: {"doc": doc[starts[i] : starts[i + 1]]}
    if name == "per_request_window":
        window = torch.randint(1, 400, (len(kv_lens),), generator=gen, dtype=torch.int32).cuda()
        return {"window": window}, lambda i: {"window": window[i : i + 1]}
    sinks = torch.randn(HQ, generator=gen).cuda()
    return {"sinks": sinks}, lambda i: {"sinks": sinks, "window": 128}


def _inputs(gen, q_lens, kv_lens, dtype=torch.bfloat16):
    q = torch.randn(sum(q_lens), HQ, D, generator=gen).to("cuda", dtype)
    k = torch.randn(sum(kv_lens), HKV, D, generator=gen).to("cuda", dtype)
    v = torch.randn(sum(kv_lens), HKV, D, generator=gen).to("cuda", dtype)
    return q, k, v


def _backend_or_skip(backend, layout):
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs sm_90")


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
@pytest.mark.parametrize("layout", ["ragged", "paged16"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_batch_prefill(name, layout, backend):
    _backend_or_skip(backend, layout)
    variant = _variant(name)
    gen = torch.Generator().manual_seed(7)
    q, k, v = _inputs(gen, Q_LENS, KV_LENS)
    batch_params, one = _params(name, KV_LENS, gen)
    # The ragged plans wait for the tile map (host summary, host-ranged items); the paged
    # ones take the default, the map and the items' cut and order queued on the device.
    waits = layout == "ragged"
    workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, workspace, backend=backend, wait_for_tile_map=waits)
    try:
        o, lse = plan_and_run(w, layout, q, k, v, Q_LENS, KV_LENS, (HQ, HKV), D, gen, batch_params)
    except ValueError as err:
        if backend == "sm90" and "cannot serve" in str(err):
            pytest.skip(str(err))
        raise
    assert (w.tile_map is not None) == (name == "doc_causal" and waits)
    check_batch(variant, q, k, v, o, lse, Q_LENS, KV_LENS, one)


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
@pytest.mark.parametrize("seed", range(3))
def test_device_tile_map_is_exact(backend, seed):
    """The classifier the module exports, on the device: every entry equals brute force."""
    _backend_or_skip(backend, "ragged")
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(seed)
    q_lens = [int(x) for x in torch.randint(1, 700, (4,), generator=gen)]
    kv_lens = [
        n + int(x) for n, x in zip(q_lens, torch.randint(0, 500, (4,), generator=gen), strict=True)
    ]
    doc = _documents(kv_lens, gen)
    i32 = dict(dtype=torch.int32)
    w = BatchPrefillWrapper(
        variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), backend=backend
    )
    w.plan(torch.tensor([0, *itertools.accumulate(q_lens)], **i32),
           torch.tensor([0, *itertools.accumulate(kv_lens)], **i32), HQ, HKV, D,
           params={"doc": doc})  # fmt: skip
    meta = dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))
    want = doc_causal_map(doc.cpu().numpy(), q_lens, kv_lens, meta["tile_q_tokens"])
    off = meta["off_tile_map"]
    got = w._workspace[off : off + want.size].cpu().numpy()
    assert (got == want).all()


def test_variant_prefill_builds_the_map_per_call():
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(1)
    q, k, v = _inputs(gen, [900], [900])
    for _ in range(2):  # same shape, new documents: a new map each call
        doc = _documents([900], gen)
        o, lse = variant.prefill(q, k, v, return_lse=True, doc=doc)
        _check(variant, q, k, v, o, lse, {"doc": doc})


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
def test_variant_prefill_sinks(backend):
    _backend_or_skip(backend, "ragged")
    variant = _variant("gpt_oss_local")
    gen = torch.Generator().manual_seed(2)
    q, k, v = _inputs(gen, [700], [1000])
    sinks = torch.randn(HQ, generator=gen).cuda()
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, sinks=sinks, window=128)
    _check(variant, q, k, v, o, lse, {"sinks": sinks, "window": 128})


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("name", list(SOURCES))
def test_batch_decode(name, q_len):
    variant = _variant(name)
    gen = torch.Generator().manual_seed(3)
    kv_lens = [300, 17, 2049, 129]
    _, k, v = _inputs(gen, [1], kv_lens)
    q = torch.randn(len(kv_lens) * q_len, HQ, D, generator=gen).to("cuda", torch.bfloat16)
    batch_params, one = _params(name, kv_lens, gen)
    cache, indptr, idx, last = _paged(k, v, kv_lens, 16, gen)
    w = BatchDecodeWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    plan_params = batch_params if name == "per_request_window" else None
    w.plan(indptr, idx, last, HQ, HKV, D, 16, q_len_per_request=q_len, params=plan_params)
    o, lse = w.run(q, cache, return_lse=True, **batch_params)
    ks = [0, *itertools.accumulate(kv_lens)]
    for i in range(len(kv_lens)):
        rows = slice(i * q_len, (i + 1) * q_len)
        c, e = ks[i], ks[i + 1]
        _check(variant, q[rows], k[c:e], v[c:e], o[rows], lse[rows], one(i))


def test_run_refuses_another_tensor():
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(4)
    q, k, v = _inputs(gen, [100], [100])
    doc = _documents([100], gen)
    w = BatchPrefillWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    i = torch.tensor([0, 100], dtype=torch.int32)
    w.plan(i, i, HQ, HKV, D, params={"doc": doc})
    with pytest.raises(ValueError, match="param 'doc': run\\(\\) was given another tensor"):
        w.run(q, (k, v), doc=doc.clone())
    doc.add_(1)
    written = "param 'doc': run\\(\\) was given the planned tensor, written since plan"
    with pytest.raises(ValueError, match=written):
        w.run(q, (k, v), doc=doc)


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
def test_cuda_graph_replay_after_replan_with_a_new_map(backend):
    """Captured run(), re-planned with other documents (same lengths: the work list keeps its
    shape), replayed: the output follows the new map (fixed map place in the workspace)."""
    _backend_or_skip(backend, "ragged")
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(5)
    n = 256
    q, k, v = _inputs(gen, [n], [n])
    doc_a = torch.tensor([0] * 100 + [1] * 156, dtype=torch.int32, device="cuda")
    doc_b = torch.tensor([0] * 200 + [1] * 56, dtype=torch.int32, device="cuda")
    doc = doc_a.clone()  # the tensor the graph reads; re-planned in place below
    i = torch.tensor([0, n], dtype=torch.int32)
    w = BatchPrefillWrapper(
        variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), backend=backend
    )
    w.plan(i, i, HQ, HKV, D, params={"doc": doc})
    out = torch.empty_like(q)
    w.run(q, (k, v), out=out, doc=doc)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        w.run(q, (k, v), out=out, doc=doc)
    torch.cuda.current_stream().wait_stream(stream)
    meta = list(w._meta)
    doc.copy_(doc_b)
    w.plan(i, i, HQ, HKV, D, params={"doc": doc})
    assert w._meta == meta, "the re-plan changed the launch: the graph would replay stale args"
    graph.replay()
    torch.cuda.synchronize()
    _, lse = w.run(q, (k, v), return_lse=True, doc=doc)
    _check(variant, q, k, v, out, lse, {"doc": doc_b})


def test_map_skips_other_documents_8k():
    """The benchmark's document workload (8K tokens from 8 documents, 32/8 heads, d=128): the
    plan built on the device map loads well under half of causal's KV (visible pairs are 22%).
    Its plan time is measured in benchmarks/lang_v2_bench.py, not here."""
    variant = _variant("doc_causal")
    cuts = sorted(torch.randperm(8191, generator=torch.Generator().manual_seed(0))[:7] + 1)
    bounds = [0, *[int(c) for c in cuts], 8192]
    doc = torch.cat(
        [
            torch.full((b - a,), i, dtype=torch.int32)
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
    ).cuda()
    workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, workspace, wait_for_tile_map=True)
    i = torch.tensor([0, 8192], dtype=torch.int32)
    w.plan(i, i, 32, 8, 128, params={"doc": doc})
    items = w._plan.schedule.items
    loaded = int((items[:, 4].astype("int64") - items[:, 3]).sum())
    tile = dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))["tile_q_tokens"]
    tiles = -(-8192 // tile)
    causal = 8 * sum(min(8192, (t + 1) * tile) for t in range(tiles))
    assert w.tile_map is not None and 0 < loaded <= causal // 2, (loaded, causal)


def _item_counters(w, ws):
    """Item 0's spare words (ATTNC_PI_NEXT, ATTNC_PI_CTAS_DONE) in the workspace."""
    at = w._plan.layout.offsets["items"]
    return ws[at : at + 32].view(torch.int32).cpu()[6:8].tolist()


def _sm90_or_skip():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the dynamic item fetch is the Hopper kernel's")


def test_item_counters_are_zero_after_every_launch_and_runs_repeat():
    """With a mask that reads token tensors the Hopper kernel's CTAs take items from a counter
    in item 0's spare words, and its last CTA sets both back to 0: after each of several
    launches (more items than CTAs, some split) they read 0, and every launch's output is the
    first's, bit for bit, and right against the float64 reference."""
    _sm90_or_skip()
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(5)
    lens = [3000, 700, 129, 4096]
    q, k, v = _inputs(gen, lens, lens)
    params, request = _params("doc_causal", lens, gen)
    indptr = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend="sm90")
    w.plan(indptr, indptr, HQ, HKV, D, params=params)
    assert w._plan.result.num_items > 132, "the test needs more items than the H200's SMs"
    first, lse = w.run(q, (k, v), return_lse=True, **params)
    first = first.clone()
    for _ in range(4):
        out = w.run(q, (k, v), **params)
        torch.cuda.synchronize()
        assert _item_counters(w, ws) == [0, 0]
        assert torch.equal(out, first)
    at = indptr.tolist()
    for i in (0, 3):
        rows = slice(at[i], at[i + 1])
        _check(variant, q[rows], k[rows], v[rows], first[rows], lse[rows], request(i))


def test_dynamic_fetch_skips_items_past_a_requests_queries():
    """The dynamic item fetch with a plan listing query tiles the device's qo_indptr no longer
    covers (the query cut from 2048 to 1000 tokens after plan()): the launch ends, the rows
    past the cut are not written, the rows before it of query tiles the plan did not split
    are finite, and the counters read 0. (The cut moves the rows' causal positions, so they
    are not compared with the planned run; test_prefill_sm90.py compares them under the
    walk, with a mask-free variant. A split tile's merge sizes its chunks' partial rows by
    the tokens qo_indptr gives it now, the cut's, while the kernel wrote them where the plan
    put them: its rows are garbage, possibly NaN, in a plan run on another batch.)"""
    _sm90_or_skip()
    variant = _variant("doc_causal")
    gen = torch.Generator().manual_seed(6)
    n, cut = 2048, 1000
    q, k, v = _inputs(gen, [n], [n])
    doc = torch.zeros(n, dtype=torch.int32, device="cuda")  # one document
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend="sm90")
    i = torch.tensor([0, n], dtype=torch.int32)
    w.plan(i, i, HQ, HKV, D, params={"doc": doc})
    at = w._plan.layout.offsets["qo_indptr"]
    ws[at : at + 8].view(torch.int32).copy_(torch.tensor([0, cut], dtype=torch.int32))
    out = torch.full_like(q, float("nan"))
    w.run(q, (k, v), out=out, doc=doc)
    torch.cuda.synchronize()
    assert out[cut:].isnan().all()
    tile = dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))["tile_q_tokens"]
    split = {int(t) for t in w._plan.schedule.merge_items[:, 1]}
    whole = [t for t in range(cut) if t // tile not in split]
    assert len(whole) > tile and torch.isfinite(out[whole]).all()
    assert _item_counters(w, ws) == [0, 0]
