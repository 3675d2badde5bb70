"""Helpers of the GPU batch tests: a shuffled page cache built from per-request K/V, a batch
planned and run over ragged or paged KV, and the check of each request against the float64
reference.

Accuracy rule as in tests/gpu/test_prefill.py: ||o - ref64|| / ||ref64|| <= ERR_FACTOR * eager
+ ERR_FLOOR, where ``eager`` is the same error of the reference run in the kernel's dtype; the
LSE is finite exactly where the reference's is, and close to it there.
"""

from __future__ import annotations

import itertools

import torch

ERR_FACTOR, ERR_FLOOR = 3.0, 2e-4


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_request(variant, q, k, v, o, lse, params) -> None:
    """One request's O and LSE against the float64 reference of ``variant``."""
    ref, ref_lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True, **params)
    eager = variant.reference(q, k, v, **params)
    assert not torch.isnan(o).any()
    assert rel_error(o, ref) <= ERR_FACTOR * rel_error(eager, ref) + ERR_FLOOR
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=2e-2, rtol=1e-3)


def paged_cache(k, v, kv_lens, page_size, gen):
    """Scatter per-request K/V (``[total_kv, H_kv, D]``, requests in order) into a shuffled NHD
    page cache with two spare pages; returns (cache, kv_indptr, kv_indices, kv_last_page_len)."""
    heads = k.shape[1:]
    pages = [-(-n // page_size) for n in kv_lens]
    total = sum(pages) + 2
    perm = torch.randperm(total, generator=gen)
    cache = torch.zeros(total, 2, page_size, *heads, dtype=k.dtype, device=k.device)
    indptr, start, tok = [0], 0, 0
    for n, p in zip(kv_lens, pages, strict=True):
        ids = perm[start : start + p].to(k.device)
        kp = torch.zeros(p * page_size, *heads, dtype=k.dtype, device=k.device)
        vp = torch.zeros_like(kp)
        kp[:n], vp[:n] = k[tok : tok + n], v[tok : tok + n]
        cache[ids, 0] = kp.view(p, page_size, *heads)
        cache[ids, 1] = vp.view(p, page_size, *heads)
        start, tok = start + p, tok + n
        indptr.append(start)
    last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages, strict=True)]
    i32 = dict(dtype=torch.int32)
    return (
        cache,
        torch.tensor(indptr, **i32),
        perm[:start].to(torch.int32),
        torch.tensor(last, **i32),
    )


def offsets(lens) -> list[int]:
    """[0, l0, l0 + l1, ...]: the indptr of consecutive requests."""
    return [0, *itertools.accumulate(lens)]


def plan_and_run(w, layout, q, k, v, q_lens, kv_lens, heads, head_dim, gen, params):
    """Plan prefill wrapper ``w`` over the batch with KV ``ragged`` or ``paged16`` (a shuffled
    16-token page cache drawn with ``gen``) and run it; returns (o, lse)."""
    num_qo_heads, num_kv_heads = heads
    i32 = dict(dtype=torch.int32)
    qo = torch.tensor(offsets(q_lens), **i32)
    if layout == "ragged":
        kv = torch.tensor(offsets(kv_lens), **i32)
        w.plan(qo, kv, num_qo_heads, num_kv_heads, head_dim, params=params)
        return w.run(q, (k, v), return_lse=True, **params)
    cache, indptr, idx, last = paged_cache(k, v, kv_lens, 16, gen)
    w.plan(qo, indptr, num_qo_heads, num_kv_heads, head_dim, kv_indices=idx,
           kv_last_page_len=last, page_size=16, params=params)  # fmt: skip
    return w.run(q, cache, return_lse=True, **params)


def check_batch(variant, q, k, v, o, lse, q_lens, kv_lens, one) -> None:
    """check_request for every request i of the batch, with params ``one(i)``."""
    qs, ks = offsets(q_lens), offsets(kv_lens)
    for i in range(len(q_lens)):
        a, b, c, e = qs[i], qs[i + 1], ks[i], ks[i + 1]
        check_request(variant, q[a:b], k[c:e], v[c:e], o[a:b], lse[a:b], one(i))
