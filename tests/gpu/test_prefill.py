"""Prefill kernels of every stdlib variant against the float64 reference.

Accuracy rule: ||o - ref64|| / ||ref64|| <= ERR_FACTOR * eager + ERR_FLOOR, where ``eager`` is
the same error of ``variant.reference`` run in the kernel's dtype. That reference widens 16-bit
q/k to float32 before Q·Kᵀ as the kernels do, so its error is the rounding of O to 16 bits
(about 1.6e-3 in bf16 and 2e-4 in fp16 on these inputs, where it was 3-5e-3 and 3-7e-4 when
it rounded Q·Kᵀ to 16 bits). A CPU model of the kernels' numerics (float32 scores and online
softmax, P rounded to 16 bits for P·V) lands at 1.2-1.4x that error
(``tests/unit/test_accuracy_rule.py``), so a factor 3 keeps twice that margin; the floor,
for rows whose eager error is tiny by luck, went from 1e-3 to 2e-4 (about one fp16 output
rounding). Both the factor and the floor are no looser than before the reference fix.
"""

import itertools
import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

VARIANTS = ["vanilla", "causal", "softcap", "alibi", "sliding_window", "sigmoid", "prefix_lm"]
LAYOUTS = ["ragged", "paged1_NHD", "paged5_HND", "paged16_NHD", "paged16_HND", "paged5_NHD"]
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 128, 256]
GROUPS = [1, 4, 8]
LENGTHS = [1, 17, 127, 577, 2049]
NUM_KV_HEADS = 2
ERR_FACTOR, ERR_FLOOR = 3.0, 2e-4


def _bound(eager_err):
    """The largest error allowed for a kernel whose eager reference errs by ``eager_err``."""
    return ERR_FACTOR * eager_err + ERR_FLOOR


def pairwise(factors, seed=0):
    """A small set of rows covering every pair of values of any two factors (greedy)."""
    import random

    rng = random.Random(seed)
    uncovered = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(factors)), 2)
        for a in range(len(factors[i]))
        for b in range(len(factors[j]))
    }
    rows = []
    while uncovered:
        best, best_gain = None, -1
        for _ in range(60):
            cand = [rng.randrange(len(f)) for f in factors]
            i, a, j, b = next(iter(uncovered))
            cand[i], cand[j] = a, b
            gain = sum(
                (x, cand[x], y, cand[y]) in uncovered
                for x, y in itertools.combinations(range(len(factors)), 2)
            )
            if gain > best_gain:
                best, best_gain = cand, gain
        for x, y in itertools.combinations(range(len(factors)), 2):
            uncovered.discard((x, best[x], y, best[y]))
        rows.append(tuple(f[k] for f, k in zip(factors, best, strict=True)))
    return rows


def _cases():
    factors = [VARIANTS, LAYOUTS, DTYPES, HEAD_DIMS, GROUPS, LENGTHS, LENGTHS]
    rows = []
    for v, lay, dt, d, g, a, b in pairwise(factors):
        rows.append((v, lay, dt, d, g, min(a, b), max(a, b)))
    return rows


CASES = _cases()


def _params(name, num_qo_heads, kv_len):
    dev = "cuda"
    if name == "softcap":
        return {"cap": 30.0}
    if name == "alibi":
        h = torch.arange(num_qo_heads, dtype=torch.float64)
        return {"slopes": (2.0 ** (-8.0 * (h + 1) / num_qo_heads)).float().to(dev)}
    if name == "sliding_window":
        return {"window": 64 if kv_len > 64 else 1}
    if name == "sigmoid":
        return {"bias": -1.0}
    if name == "prefix_lm":
        return {"prefix_len": kv_len // 3}
    return {}


def _rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _paged_cache(k, v, page_size, layout, generator):
    """Scatter k/v [kv_len, H, D] into a shuffled paged cache; return cache, indices, last."""
    kv_len, h, d = k.shape
    pages = max(1, math.ceil(kv_len / page_size))
    total = pages + 3
    perm = torch.randperm(total, generator=generator)[:pages]
    cache = torch.randn(total, 2, page_size, h, d, dtype=k.dtype, device=k.device)
    padded = pages * page_size
    kp = torch.zeros(padded, h, d, dtype=k.dtype, device=k.device)
    vp = torch.zeros_like(kp)
    kp[:kv_len], vp[:kv_len] = k, v
    cache[perm.cuda(), 0] = kp.view(pages, page_size, h, d)
    cache[perm.cuda(), 1] = vp.view(pages, page_size, h, d)
    if layout == "HND":
        cache = cache.transpose(2, 3).contiguous()
    last = kv_len - (pages - 1) * page_size
    return cache, perm.to(torch.int32), last


def _run_one(variant, q, k, v, layout, params, generator):
    kv_len = k.shape[0]
    i32 = dict(dtype=torch.int32)
    qo_indptr = torch.tensor([0, q.shape[0]], **i32)
    ws = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    out = torch.full_like(q, float("nan"))
    if layout == "ragged":
        w = BatchPrefillWrapper(variant, ws)
        kv_indptr = torch.tensor([0, kv_len], **i32)
        w.plan(qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[2], dtype=q.dtype)
        return w.run(q, (k, v), return_lse=True, out=out, **params)
    page_size, kv_layout = int(layout[5:].split("_")[0]), layout.split("_")[1]
    cache, indices, last = _paged_cache(k, v, page_size, kv_layout, generator)
    w = BatchPrefillWrapper(variant, ws, kv_layout=kv_layout)
    w.plan(
        qo_indptr, torch.tensor([0, indices.numel()], **i32), q.shape[1], k.shape[1],
        q.shape[2], kv_indices=indices, kv_last_page_len=torch.tensor([last], **i32),
        page_size=page_size, dtype=q.dtype,
    )  # fmt: skip
    return w.run(q, cache, return_lse=True, out=out, **params)


@pytest.mark.parametrize(("name", "layout", "dtype", "head_dim", "group", "q_len", "kv_len"), CASES)
def test_prefill_matches_reference(name, layout, dtype, head_dim, group, q_len, kv_len):
    variant = attnc.load(f"stdlib:{name}")
    gen = torch.Generator().manual_seed(q_len * 7919 + kv_len)
    hq, hkv = NUM_KV_HEADS * group, NUM_KV_HEADS
    q = torch.randn(q_len, hq, head_dim, generator=gen).to("cuda", dtype)
    k = torch.randn(kv_len, hkv, head_dim, generator=gen).to("cuda", dtype)
    v = torch.randn(kv_len, hkv, head_dim, generator=gen).to("cuda", dtype)
    params = _params(name, hq, kv_len)
    ref, ref_lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True, **params)
    eager = variant.reference(q, k, v, **params)
    o, lse = _run_one(variant, q, k, v, layout, params, gen)
    assert o.dtype == dtype and o.shape == q.shape
    assert not torch.isnan(o).any()
    assert lse.dtype == torch.float32 and lse.shape == (q_len, hq)
    bound = _bound(_rel_err(eager, ref))
    assert _rel_err(o, ref) <= bound
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=2e-2, rtol=1e-3)


def test_batched_equals_per_request():
    variant = attnc.load("stdlib:causal")
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, dtype = 8, 2, 128, torch.bfloat16
    q_lens, kv_lens = [17, 1, 577, 0, 127], [17, 300, 600, 5, 2049]
    qs = [torch.randn(n, hq, d, generator=gen).to("cuda", dtype) for n in q_lens]
    ks = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    vs = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    qo_indptr = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    kv_indptr = torch.tensor([0, *itertools.accumulate(kv_lens)], dtype=torch.int32)
    w = BatchPrefillWrapper(variant, torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, dtype=dtype)
    o, lse = w.run(torch.cat(qs), (torch.cat(ks), torch.cat(vs)), return_lse=True)
    for i in range(len(q_lens)):
        one, one_lse = variant.prefill(qs[i], ks[i], vs[i], return_lse=True)
        s, e = int(qo_indptr[i]), int(qo_indptr[i + 1])
        # Tile sizes may differ between the two launches, so allow summation-order noise.
        torch.testing.assert_close(o[s:e].float(), one.float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[s:e], one_lse, atol=1e-3, rtol=1e-4)


def _small_wrapper(name="causal"):
    variant = attnc.load(f"stdlib:{name}")
    return variant, BatchPrefillWrapper(
        variant, torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    )


def test_bad_dtype_raises():
    variant, w = _small_wrapper()
    i = torch.tensor([0, 4], dtype=torch.int32)
    w.plan(i, i, 4, 4, 64, dtype=torch.bfloat16)
    q = torch.zeros(4, 4, 64, device="cuda", dtype=torch.float32)
    with pytest.raises(
        ValueError, match="q: dtype must be torch.bfloat16 or torch.float16, got torch.float32"
    ):
        w.run(q, (q.bfloat16(), q.bfloat16()))
    with pytest.raises(
        ValueError, match="q: dtype torch.float16 differs from the planned dtype torch.bfloat16"
    ):
        w.run(q.half(), (q.half(), q.half()))


def test_bad_indptr_raises():
    _, w = _small_wrapper()
    bad = torch.tensor([0, 5, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_indptr: must be non-decreasing"):
        w.plan(torch.tensor([0, 1, 2], dtype=torch.int32), bad, 4, 4, 64)
    w.plan(
        torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32), 4, 4, 64
    )
    q = torch.zeros(4, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(5, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match="kv_indptr: last value 4 does not match k.shape\\[0\\] = 5"
    ):
        w.run(q, (k, k))


def test_page_index_out_of_range_raises():
    variant = attnc.load("stdlib:causal")
    w = BatchPrefillWrapper(variant, torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    i32 = dict(dtype=torch.int32)
    w.plan(
        torch.tensor([0, 4], **i32), torch.tensor([0, 2], **i32), 4, 4, 64,
        kv_indices=torch.tensor([1, 9], **i32), kv_last_page_len=torch.tensor([3], **i32),
        page_size=16,
    )  # fmt: skip
    q = torch.zeros(4, 4, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(8, 2, 16, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match="kv_indices: page index 9 out of range for a cache of 8 pages"
    ):
        w.run(q, cache)


def test_missing_param_raises():
    variant = attnc.load("stdlib:sliding_window")
    q = torch.zeros(4, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match="variant 'sliding_window': missing param 'window' \\(i32\\)"
    ):
        variant.prefill(q, q, q)


@pytest.mark.parametrize("name", VARIANTS)
def test_split_kv_matches_reference_and_is_deterministic(name):
    """Short queries over long paged KV: the planner splits the KV, the merge combines it."""
    variant = attnc.load(f"stdlib:{name}")
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d, dtype, page = 8, 2, 128, torch.bfloat16, 16
    q_lens, kv_lens = [3, 8, 1], [3000, 5000, 700]
    qs = [torch.randn(n, hq, d, generator=gen).to("cuda", dtype) for n in q_lens]
    ks = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    vs = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    caches, indices, lasts, base = [], [], [], 0
    for k, v in zip(ks, vs, strict=True):
        cache, idx, last = _paged_cache(k, v, page, "NHD", gen)
        caches.append(cache)
        indices.append(idx + base)
        lasts.append(last)
        base += cache.shape[0]
    i32 = dict(dtype=torch.int32)
    qo_indptr = torch.tensor([0, *itertools.accumulate(q_lens)], **i32)
    kv_indptr = torch.tensor([0, *itertools.accumulate(len(i) for i in indices)], **i32)
    w = BatchPrefillWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(
        qo_indptr, kv_indptr, hq, hkv, d, kv_indices=torch.cat(indices),
        kv_last_page_len=torch.tensor(lasts, **i32), page_size=page, dtype=dtype,
    )  # fmt: skip
    assert w._plan is not None and w._plan.schedule.num_merge > 0  # the KV really is split
    params = _params(name, hq, min(kv_lens))
    q, cache = torch.cat(qs), torch.cat(caches)
    o1, lse1 = w.run(q, cache, return_lse=True, **params)
    o2, lse2 = w.run(q, cache, return_lse=True, **params)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    for i in range(len(q_lens)):
        s, e = int(qo_indptr[i]), int(qo_indptr[i + 1])
        ref, ref_lse = variant.reference(
            qs[i].double(), ks[i].double(), vs[i].double(), return_lse=True, **params
        )
        eager = variant.reference(qs[i], ks[i], vs[i], **params)
        assert _rel_err(o1[s:e], ref) <= _bound(_rel_err(eager, ref))
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse1[s:e]), finite)
        if finite.any():
            torch.testing.assert_close(
                lse1[s:e][finite].double(), ref_lse[finite], atol=2e-2, rtol=1e-3
            )


def test_small_workspace_plans_without_split():
    """A workspace with no room for partial states still gives the right answer."""
    variant = attnc.load("stdlib:causal")
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(4, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(6000, 2, 128, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(6000, 2, 128, generator=gen).to("cuda", torch.bfloat16)
    i32 = dict(dtype=torch.int32)
    w = BatchPrefillWrapper(variant, torch.empty(8 << 10, dtype=torch.uint8, device="cuda"))
    w.plan(torch.tensor([0, 4], **i32), torch.tensor([0, 6000], **i32), 8, 2, 128)
    assert w._plan is not None and w._plan.schedule.num_merge == 0
    o = w.run(q, (k, v))
    ref = variant.reference(q.double(), k.double(), v.double())
    assert _rel_err(o, ref) <= _bound(_rel_err(variant.reference(q, k, v), ref))


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm"])
def test_mask_params_given_to_plan(name):
    """plan(params=...) sizes each tile's KV range from the mask; the result is unchanged, and
    run() refuses a different value than the plan was made for."""
    variant = attnc.load(f"stdlib:{name}")
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, dtype = 8, 2, 128, torch.bfloat16
    q_lens, kv_lens = [700, 5, 2100], [900, 4000, 2100]
    qs = [torch.randn(n, hq, d, generator=gen).to("cuda", dtype) for n in q_lens]
    ks = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    vs = [torch.randn(n, hkv, d, generator=gen).to("cuda", dtype) for n in kv_lens]
    i32 = dict(dtype=torch.int32)
    qo_indptr = torch.tensor([0, *itertools.accumulate(q_lens)], **i32)
    kv_indptr = torch.tensor([0, *itertools.accumulate(kv_lens)], **i32)
    params = _params(name, hq, 600)
    w = BatchPrefillWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, dtype=dtype, params=params)
    items = w._plan.schedule.items
    assert (items[:, 4] - items[:, 3]).min() < min(kv_lens)  # ranges come from the mask
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    o = w.run(q, (k, v), **params)
    for i in range(len(q_lens)):
        s, e = int(qo_indptr[i]), int(qo_indptr[i + 1])
        ref = variant.reference(qs[i].double(), ks[i].double(), vs[i].double(), **params)
        eager = variant.reference(qs[i], ks[i], vs[i], **params)
        assert _rel_err(o[s:e], ref) <= _bound(_rel_err(eager, ref))
    (key,) = params
    with pytest.raises(ValueError, match=f"param '{key}' is 201 in run\\(\\), but plan\\(\\)"):
        w.run(q, (k, v), **{key: 201})
    # single_prefill plans with the mask params too, once per value
    o1 = variant.prefill(qs[2], ks[2], vs[2], **params)
    o2 = variant.prefill(qs[2], ks[2], vs[2], **{key: 201})
    for out, p in ((o1, params), (o2, {key: 201})):
        ref = variant.reference(qs[2].double(), ks[2].double(), vs[2].double(), **p)
        eager = variant.reference(qs[2], ks[2], vs[2], **p)
        assert _rel_err(out, ref) <= _bound(_rel_err(eager, ref))
