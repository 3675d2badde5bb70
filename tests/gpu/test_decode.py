"""Batched paged decode of every stdlib variant against the float64 reference.

Accuracy rule (as for prefill, where its derivation is): ||o - ref64|| / ||ref64|| <=
ERR_FACTOR * (the same error of ``variant.reference`` run in the kernel's dtype) + ERR_FLOOR,
over all rows of the batch. The reference accumulates Q·Kᵀ in float32 as the kernels do, so
its error is O's final 16-bit rounding; the floor went from 1e-3 to 2e-4 with that fix.
"""

import math

import pytest
import torch

import attnc
from attnc.runtime.planning import decode_plan
from attnc.runtime.planning.workspace import CapacityError
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.merge import merge_state

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

VARIANTS = ["vanilla", "causal", "softcap", "alibi", "sliding_window", "sigmoid", "prefix_lm"]
HQ, HKV = 32, 8
WORKSPACE = 128 << 20
ERR_FACTOR, ERR_FLOOR = 3.0, 2e-4


def _params(name, hq=HQ):
    if name == "softcap":
        return {"cap": 30.0}
    if name == "alibi":
        h = torch.arange(hq, dtype=torch.float64)
        return {"slopes": (2.0 ** (-8.0 * (h + 1) / hq)).float().cuda()}
    if name == "sliding_window":
        return {"window": 300}
    if name == "sigmoid":
        return {"bias": -1.0}
    if name == "prefix_lm":
        return {"prefix_len": 40}
    return {}


class Batch:
    """A paged cache in random page order plus per-request K/V for the reference."""

    def __init__(self, kv_lens, page_size, layout, q_len, dtype=torch.bfloat16, d=128, seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.kv_lens, self.page_size, self.layout, self.q_len = kv_lens, page_size, layout, q_len
        pages = [max(0, -(-n // page_size)) for n in kv_lens]
        total = sum(pages) + 3
        perm = torch.randperm(total, generator=g).to(torch.int32)
        inner = (page_size, HKV) if layout == "NHD" else (HKV, page_size)
        self.cache = torch.randn((total, 2, *inner, d), generator=g).to(dtype).cuda()
        indptr = [0]
        for p in pages:
            indptr.append(indptr[-1] + p)
        self.kv_indptr = torch.tensor(indptr, dtype=torch.int32)
        self.kv_indices = perm[: indptr[-1]].contiguous()
        self.last = torch.tensor(
            [(n - 1) % page_size + 1 if n > 0 else 0 for n in kv_lens], dtype=torch.int32
        )
        self.q = torch.randn((len(kv_lens) * q_len, HQ, d), generator=g).to(dtype).cuda()

    def kv_of(self, i):
        ids = self.kv_indices[self.kv_indptr[i] : self.kv_indptr[i + 1]].long().cuda()
        blocks = self.cache[ids]  # [p, 2, ...]
        if self.layout == "HND":
            blocks = blocks.transpose(2, 3)
        k = blocks[:, 0].reshape(-1, HKV, blocks.shape[-1])[: self.kv_lens[i]]
        v = blocks[:, 1].reshape(-1, HKV, blocks.shape[-1])[: self.kv_lens[i]]
        return k, v

    def plan(self, wrapper, **kw):
        wrapper.plan(
            self.kv_indptr, self.kv_indices, self.last, HQ, HKV, self.q.shape[-1],
            self.page_size, q_len_per_request=self.q_len, dtype=self.q.dtype, **kw,
        )  # fmt: skip

    def reference(self, variant, params, dtype):
        outs, lses = [], []
        for i in range(len(self.kv_lens)):
            k, v = self.kv_of(i)
            q = self.q[i * self.q_len : (i + 1) * self.q_len]
            o, lse = variant.reference(
                q.to(dtype), k.to(dtype), v.to(dtype), return_lse=True, **params
            )
            outs.append(o)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check_accuracy(variant, batch, params, o, lse):
    ref_o, ref_lse = batch.reference(variant, params, torch.float64)
    low_o, _ = batch.reference(variant, params, batch.q.dtype)
    err, eager = _rel(o, ref_o), _rel(low_o, ref_o)
    assert err <= ERR_FACTOR * eager + ERR_FLOOR, f"error {err:.3g} vs eager {eager:.3g}"
    assert torch.isfinite(o).all()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if variant.ir.normalize == "softmax":
        assert torch.allclose(lse[finite].double(), ref_lse[finite], atol=2e-2, rtol=1e-3)
    else:
        assert torch.equal(lse, torch.zeros_like(lse))


def _run(name, batch, split, **wrapper_kw):
    variant = attnc.load(f"stdlib:{name}")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, kv_layout=batch.layout, **wrapper_kw)
    params = _params(name)
    batch.plan(wrapper)
    sched = wrapper.last_schedule
    assert (sched.num_part_slots > 0) == split, sched.chunk_size
    o, lse = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    o2, lse2 = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    assert torch.equal(o, o2) and torch.equal(lse, lse2), "not bit-identical run to run"
    return variant, params, o, lse


MIXED = [1, 17, 127, 577, 2049, 5000, 33, 0, 300]


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize(
    "layout,page_size,q_len,lengths,split",
    [
        ("NHD", 16, 1, MIXED, True),
        ("HND", 1, 4, MIXED[:6], True),
    ],
)
def test_variant_split(name, layout, page_size, q_len, lengths, split):
    batch = Batch(lengths, page_size, layout, q_len, seed=hash(name) % 1000)
    variant, params, o, lse = _run(name, batch, split)
    _check_accuracy(variant, batch, params, o, lse)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_unsplit(name, monkeypatch):
    # plan() reads MIN_CHUNK when it configures the planner for a new shape.
    monkeypatch.setattr(decode_plan, "MIN_CHUNK", 1 << 30)
    batch = Batch(MIXED, 16, "HND", 1, seed=3)
    variant, params, o, lse = _run(name, batch, False)
    _check_accuracy(variant, batch, params, o, lse)


@pytest.mark.parametrize(
    "name,lengths,page_size,layout,q_len,dtype",
    [
        ("causal", [1 + (i * 37) % 300 for i in range(256)], 16, "NHD", 1, torch.bfloat16),
        ("softcap", [min(32768, max(64, int(32768 / (i + 1) ** 1.2))) for i in range(12)],
         16, "NHD", 1, torch.bfloat16),
        ("alibi", [4096, 31, 1000, 2], 1, "NHD", 4, torch.float16),
        ("sliding_window", [700, 2500, 64, 9], 16, "HND", 4, torch.bfloat16),
    ],
)  # fmt: skip
def test_batches(name, lengths, page_size, layout, q_len, dtype):
    batch = Batch(lengths, page_size, layout, q_len, dtype=dtype, seed=len(lengths))
    variant = attnc.load(f"stdlib:{name}")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, kv_layout=layout)
    batch.plan(wrapper)
    params = _params(name)
    o, lse = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    _check_accuracy(variant, batch, params, o, lse)


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm"])
@pytest.mark.parametrize("q_len", [1, 3])
def test_mask_params_given_to_plan(name, q_len):
    """plan(params=...) chunks only the KV the mask shows; same accuracy, bit-identical
    runs, a CUDA graph replays after a replan, and run() refuses another value."""
    batch = Batch([5000, 301, 17, 0, 2049, 40], 16, "NHD", q_len, seed=q_len)
    variant = attnc.load(f"stdlib:{name}")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, use_cuda_graph=True)
    params = _params(name)
    batch.plan(wrapper, params=params)
    items = wrapper.last_schedule.items
    if name == "sliding_window":  # request 0 (5000 keys, window 300) reads only its tail
        assert items[items[:, 0] == 0][:, 3].min() >= 5000 - 300 - q_len - 64
    o, lse = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    o2, lse2 = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    _check_accuracy(variant, batch, params, o, lse)
    (key,) = params
    with pytest.raises(ValueError, match=f"param '{key}' is 7 in run\\(\\), but plan\\(\\)"):
        wrapper.run(batch.q, batch.cache, **{key: 7})
    graph = torch.cuda.CUDAGraph()
    out = torch.empty_like(batch.q)
    with torch.cuda.graph(graph):
        wrapper.run(batch.q, batch.cache, out=out, **params)
    batch.plan(wrapper, params=params)  # a replan keeps the graph valid
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, o)


def test_head_dim_64_kv_tuple():
    batch = Batch([300, 5, 4000], 16, "NHD", 2, dtype=torch.float16, d=64, seed=5)
    variant = attnc.load("stdlib:softcap")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws)
    batch.plan(wrapper)
    kv = (batch.cache[:, 0], batch.cache[:, 1])
    o, lse = wrapper.run(batch.q, kv, return_lse=True, cap=30.0)
    _check_accuracy(variant, batch, {"cap": 30.0}, o, lse)


def test_cuda_graph_replay_after_replan():
    variant = attnc.load("stdlib:softcap")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, use_cuda_graph=True, max_batch_size=8)
    a = Batch([100, 2000, 7, 9000], 16, "NHD", 1, seed=11)
    b = Batch([3000, 1, 600, 50], 16, "NHD", 1, seed=12)
    b.cache = a.cache  # same cache and q buffers, different page tables
    b.q = a.q
    b.kv_indices = torch.randperm(a.cache.shape[0])[: int(b.kv_indptr[-1])].to(torch.int32)
    a.plan(wrapper)
    out = torch.empty_like(a.q)
    wrapper.run(a.q, a.cache, out=out, cap=30.0)  # warm up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        wrapper.run(a.q, a.cache, out=out, cap=30.0)
    torch.cuda.current_stream().wait_stream(stream)
    b.plan(wrapper)
    graph.replay()
    eager = BatchDecodeWrapper(variant, torch.empty_like(ws))
    b.plan(eager)
    expect = eager.run(b.q, b.cache, cap=30.0)
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    _check_accuracy(
        variant, b, {"cap": 30.0}, out, eager.run(b.q, b.cache, return_lse=True, cap=30.0)[1]
    )


def test_capture_without_graph_flag_raises():
    batch = Batch([10, 20], 16, "NHD", 1)
    variant = attnc.load("stdlib:vanilla")
    wrapper = BatchDecodeWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    batch.plan(wrapper)
    wrapper.run(batch.q, batch.cache)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="use_cuda_graph=True"):
        with torch.cuda.graph(graph):
            wrapper.run(batch.q, batch.cache)


def test_errors():
    batch = Batch([10, 20, 30], 16, "NHD", 1)
    variant = attnc.load("stdlib:alibi")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    small = BatchDecodeWrapper(variant, ws, max_batch_size=2)
    with pytest.raises(CapacityError, match="max_batch_size=2"):
        batch.plan(small)
    wrapper = BatchDecodeWrapper(variant, ws)
    batch.plan(wrapper)
    with pytest.raises(ValueError, match="^q: expected shape"):
        wrapper.run(batch.q[:2], batch.cache, slopes=_params("alibi")["slopes"])
    with pytest.raises(ValueError, match="slopes"):
        wrapper.run(batch.q, batch.cache)
    bad = batch.last.clone()
    bad[1] = 17
    with pytest.raises(ValueError, match=r"kv_last_page_len\[1\]=17"):
        wrapper.plan(batch.kv_indptr, batch.kv_indices, bad, HQ, HKV, 128, 16)
    with pytest.raises(ValueError, match="kv_indices: page index"):
        wrapper.plan(batch.kv_indptr, batch.kv_indices + 1000, batch.last, HQ, HKV, 128, 16)
        wrapper.run(batch.q, batch.cache, slopes=_params("alibi")["slopes"])


def _ref_state(q, k, v):
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.double())
    return o, lse.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_state_matches_concatenated_kv(dtype):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(5, 4, 64, generator=g).cuda()
    k = torch.randn(300, 4, 64, generator=g).cuda()
    v = torch.randn(300, 4, 64, generator=g).cuda()
    oa, la = _ref_state(q, k[:100], v[:100])
    ob, lb = _ref_state(q, k[100:], v[100:])
    o, lse = merge_state(oa.to(dtype), la.float(), ob.to(dtype), lb.float())
    ref_o, ref_lse = _ref_state(q, k, v)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(o.double(), ref_o, atol=tol, rtol=tol)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    # -inf on one side returns the other state; on both sides O 0 and LSE -inf.
    ninf = torch.full_like(la.float(), -math.inf)
    o1, l1 = merge_state(oa.to(dtype), la.float(), torch.zeros_like(oa.to(dtype)), ninf)
    assert torch.equal(o1, oa.to(dtype).float().to(dtype)) or torch.allclose(
        o1.double(), oa.to(dtype).double(), atol=1e-6
    )
    assert torch.equal(l1, la.float())
    o2, l2 = merge_state(oa.to(dtype), ninf, ob.to(dtype), ninf)
    assert torch.equal(o2, torch.zeros_like(o2)) and torch.equal(l2, ninf)
