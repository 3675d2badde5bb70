"""Helpers of the GPU batch tests: a shuffled page cache built from per-request K/V, and the
check of one request against the float64 reference.

Accuracy rule as in tests/gpu/test_prefill.py: ||o - ref64|| / ||ref64|| <= ERR_FACTOR * eager
+ ERR_FLOOR, where ``eager`` is the same error of the reference run in the kernel's dtype; the
LSE is finite exactly where the reference's is, and close to it there.
"""

from __future__ import annotations

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
