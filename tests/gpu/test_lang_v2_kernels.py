"""Language-v2 kernel features on the GPU against the fp64 reference, on both prefill templates
and in decode: attention sinks (unsplit items start at the sink, split tiles and requests get
it in the merge; a row without a visible key gives O 0 and LSE = sink), masks that read
per-token tensors through the plan's tile map (EMPTY blocks skipped, FULL ones unmasked) and
the per-request RequestInfo offsets (q_start / kv_start) in batches."""

from __future__ import annotations

import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

I32 = dict(dtype=torch.int32)
BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])
# bf16 inputs: the kernels round P to bf16 before P V; the fp64 reference does not.
O_TOL, LSE_TOL = 2e-2, 2e-2


def _indptr(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], **I32)


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _batch(lens, hq, hkv, d=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    qs = [torch.randn(a, hq, d, generator=g).to("cuda", torch.bfloat16) for a, _ in lens]
    ks = [torch.randn(b, hkv, d, generator=g).to("cuda", torch.bfloat16) for _, b in lens]
    vs = [torch.randn(b, hkv, d, generator=g).to("cuda", torch.bfloat16) for _, b in lens]
    return qs, ks, vs


def _reference(variant, qs, ks, vs, per_request):
    """fp64 reference, request by request (per_request(b) gives request b's params)."""
    outs, lses = [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs, strict=True)):
        o, lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True,
                                   **per_request(b))  # fmt: skip
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _prefill(variant, backend, qs, ks, vs, params, plan_params=None, wait=True):
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend, wait_for_tile_map=wait)
    q = torch.cat(qs)
    w.plan(_indptr([x.shape[0] for x in qs]), _indptr([x.shape[0] for x in ks]), q.shape[1],
           ks[0].shape[1], q.shape[2], dtype=q.dtype, params=plan_params)  # fmt: skip
    o, lse = w.run(q, (torch.cat(ks), torch.cat(vs)), return_lse=True, **params)
    return o, lse, w


def _check(o, lse, ref_o, ref_lse):
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert _rel(o, ref_o) <= O_TOL
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), finite.cpu())
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() <= LSE_TOL


def _sinks(hq, seed=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(hq, generator=g) * 3.0).float().cuda()


# (q_len, kv_len) per request: q_len > kv_len gives rows without any visible key; (17, 4099)
# with one query head per KV head is split over several KV chunks (merge path).
SINK_BATCHES = [[(70, 200), (1, 1), (33, 577)], [(17, 4099)], [(40, 20), (5, 130)]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lens", SINK_BATCHES)
@pytest.mark.parametrize("window", [8, 100000])
def test_prefill_sinks(backend, lens, window):
    variant = attnc.load("stdlib:gpt_oss_local")
    group = 1 if lens == [(17, 4099)] else 4
    hq, hkv = 2 * group, 2
    qs, ks, vs = _batch(lens, hq, hkv, seed=len(lens) + window % 7)
    params = {"sinks": _sinks(hq), "window": window}
    o, lse, w = _prefill(variant, backend, qs, ks, vs, params, plan_params={"window": window})
    ref_o, ref_lse = _reference(variant, qs, ks, vs, lambda b: params)
    _check(o, lse, ref_o, ref_lse)
    if lens == [(17, 4099)] and window > 4099:
        assert w._plan.schedule.num_merge > 0, "the plan was expected to split the KV range"


# A plan whose longest query has 2048 tokens or more (kThreeConsumersMinQ) runs the sink
# variant's Hopper kernel on three consumer warpgroups (192 packed rows) at head_dim 64 and
# 128, and on 80-key stages at 256: the shapes the batches above, all shorter, never reach.
LONG = 2048


@pytest.mark.skipif("sm90" not in BACKENDS, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [128, 100000])
def test_prefill_sinks_with_a_long_query_on_the_widest_hopper_shapes(d, window):
    variant = attnc.load("stdlib:gpt_oss_local")
    hq, hkv = 8, 2
    lens = [(LONG, LONG), (17, 300), (1, 1)]
    qs, ks, vs = _batch(lens, hq, hkv, d=d, seed=d + window % 7)
    params = {"sinks": _sinks(hq), "window": window}
    o, lse, w = _prefill(variant, "sm90", qs, ks, vs, params, plan_params={"window": window})
    if d < 256:
        assert w._module.tile_q_tokens(d, hq // hkv, LONG) == 192 // (hq // hkv)
    ref_o, ref_lse = _reference(variant, qs, ks, vs, lambda b: params)
    _check(o, lse, ref_o, ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_row_without_keys_is_zero_with_the_sink_as_lse(backend):
    variant = attnc.load("stdlib:gpt_oss_local")
    hq, hkv = 8, 2
    qs, ks, vs = _batch([(40, 20)], hq, hkv, seed=9)
    sinks = _sinks(hq)
    o, lse, _ = _prefill(variant, backend, qs, ks, vs, {"sinks": sinks, "window": 128})
    # q_pos = q_idx - 20 < 0 for the first 20 queries: no key is visible.
    assert (o[:20] == 0).all()
    assert torch.allclose(lse[:20], sinks.expand(20, hq), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lens", [[(300, 300), (1, 77), (129, 1000)], [(1000, 1000)]])
def test_prefill_document_mask_with_tile_map(backend, lens):
    variant = attnc.load("stdlib:doc_causal")
    hq, hkv = 8, 2
    qs, ks, vs = _batch(lens, hq, hkv, seed=5)
    g = torch.Generator().manual_seed(11)
    docs = []
    for _, kv in lens:  # sorted document ids, lengths 1..300
        cuts = torch.randint(1, 300, (kv,), generator=g).cumsum(0)
        docs.append((torch.arange(kv)[:, None] >= cuts[None, :]).sum(1).to(torch.int32))
    doc = torch.cat(docs).cuda()
    o, lse, w = _prefill(variant, backend, qs, ks, vs, {"doc": doc}, plan_params={"doc": doc})
    ref_o, ref_lse = _reference(variant, qs, ks, vs, lambda b: {"doc": docs[b].cuda()})
    _check(o, lse, ref_o, ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "lens, group", [([(300, 300), (1, 77), (129, 1000)], 4), ([(2100, 2100)], 4), ([(17, 4099)], 1)]
)
def test_document_mask_with_a_map_plan_did_not_wait_for(backend, lens, group):
    """wait_for_tile_map=False: items planned by the closed form, then cut to their map rows
    and ordered by them on the device. Same output as the plan that waits (bit for bit where
    neither splits a tile: the same tiles per item, in another order), within the fp64
    tolerance where the closed form splits KV ranges the map would not."""
    variant = attnc.load("stdlib:doc_causal")
    hkv = 2
    qs, ks, vs = _batch(lens, hkv * group, hkv, seed=7)
    g = torch.Generator().manual_seed(13)
    docs = []
    for _, kv in lens:
        cuts = torch.randint(1, 400, (kv,), generator=g).cumsum(0)
        docs.append((torch.arange(kv)[:, None] >= cuts[None, :]).sum(1).to(torch.int32))
    doc = torch.cat(docs).cuda()
    args = (variant, backend, qs, ks, vs, {"doc": doc})
    o, lse, w = _prefill(*args, plan_params={"doc": doc}, wait=False)
    assert w.tile_map is None  # no host copy: the map stayed on the device
    o2, lse2, w2 = _prefill(*args, plan_params={"doc": doc})
    ref_o, ref_lse = _reference(variant, qs, ks, vs, lambda b: {"doc": docs[b].cuda()})
    _check(o, lse, ref_o, ref_lse)
    if w._plan.schedule.num_merge == 0 and w2._plan.schedule.num_merge == 0:
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
    # The device step cut every item where a waiting plan starts it (its first non-EMPTY map
    # column; the end may differ past the diagonal, where every key is masked) and kept the
    # same non-empty items (their order by map columns is checked on the CPU:
    # tests/codegen/test_item_map_order.py).
    n = int(w._plan.result.num_items)
    at = int(w._plan.result.off_items)
    items = w._workspace[at : at + 32 * n].view(torch.int32).view(n, 8).cpu()
    assert (items[:, 6:] == 0).all()
    if w._plan.schedule.num_merge == 0 and w2._plan.schedule.num_merge == 0:
        planned = w2._plan.schedule.items

        def starts(rows):
            return {(int(r[0]), int(r[1]), int(r[2])): int(r[3]) for r in rows if r[4] > r[3]}

        assert starts(items) == starts(planned)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_of_a_map_plan_did_not_wait_for(backend):
    """A CUDA graph captured on run() replays a re-planned map and work list that plan()
    queued without waiting (the map and the items keep their places in the workspace)."""
    variant = attnc.load("stdlib:doc_causal")
    lens = [(700, 700)]
    qs, ks, vs = _batch(lens, 8, 2, seed=21)
    q, k, v = qs[0], ks[0], vs[0]
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend, wait_for_tile_map=False)
    indptr = _indptr([700])
    docs = [
        torch.div(torch.arange(700), n, rounding_mode="floor").to(torch.int32) for n in (90, 333)
    ]
    doc = docs[0].cuda()
    w.plan(indptr, indptr, 8, 2, 128, dtype=q.dtype, params={"doc": doc})
    out = torch.empty_like(q)
    w.run(q, (k, v), out=out, doc=doc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k, v), out=out, doc=doc)
    meta = list(w._meta)
    for values in docs:
        doc.copy_(values.cuda())
        w.plan(indptr, indptr, 8, 2, 128, dtype=q.dtype, params={"doc": doc})
        assert w._meta == meta, "the re-plan changed the launch: the graph would replay stale args"
        graph.replay()
        torch.cuda.synchronize()
        ref = variant.reference(q.double(), k.double(), v.double(), doc=values.cuda())
        assert _rel(out, ref) <= O_TOL


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_sinks(split, q_len):
    variant = attnc.load("stdlib:gpt_oss_local")
    page, hq, hkv, d = 16, 8, 2, 128
    lens = [5000, 40, 1] if split else [40, 70, 1]
    pages = [-(-n // page) for n in lens]
    indptr = _indptr(pages)
    ids = torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(2)).to(**I32)
    last = torch.tensor([(n - 1) % page + 1 for n in lens], **I32)
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(int(indptr[-1]), 2, page, hkv, d, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens) * q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    params = {"sinks": _sinks(hq), "window": 100000}
    w = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, hq, hkv, d, page, q_len_per_request=q_len)
    o, lse = w.run(q, cache, return_lse=True, **params)
    refs = []
    for b, n in enumerate(lens):
        pg = ids[int(indptr[b]) : int(indptr[b + 1])].long().cuda()
        k = cache[pg, 0].reshape(-1, hkv, d)[:n]
        v = cache[pg, 1].reshape(-1, hkv, d)[:n]
        qb = q[b * q_len : (b + 1) * q_len]
        refs.append(variant.reference(qb.double(), k.double(), v.double(), return_lse=True,
                                      **params))  # fmt: skip
    ref_o = torch.cat([r[0] for r in refs])
    ref_lse = torch.cat([r[1] for r in refs])
    _check(o, lse, ref_o, ref_lse)


def test_sink_of_minus_infinity_is_no_sink():
    variant = attnc.load("stdlib:gpt_oss_local")
    plain = attnc.load("stdlib:sliding_window")
    hq, hkv = 8, 2
    qs, ks, vs = _batch([(50, 90)], hq, hkv, seed=8)
    sinks = torch.full((hq,), -math.inf, device="cuda")
    for backend in BACKENDS:
        o, lse, _ = _prefill(variant, backend, qs, ks, vs, {"sinks": sinks, "window": 30})
        o2, lse2, _ = _prefill(plain, backend, qs, ks, vs, {"window": 30})
        assert (o.float() - o2.float()).abs().max().item() <= 1e-2  # a bf16 rounding at most
        assert torch.allclose(lse, lse2, atol=1e-5, rtol=0)
