"""Random bf16 inputs on the GPU: dense single requests and paged batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.workloads import VariantSpec


def alibi_slopes(num_heads: int, device: str = "cuda"):
    """The standard ALiBi slopes 2^(-8 (h + 1) / H) (FlashInfer's, for a power-of-two H)."""
    import torch

    heads = torch.arange(1, num_heads + 1, dtype=torch.float32)
    return torch.pow(2.0, -8.0 * heads / num_heads).to(device)


def variant_params(variant: VariantSpec, num_qo_heads: int, device: str = "cuda") -> dict:
    """Keyword parameters for attnc: the scalars plus tensor parameters (ALiBi slopes)."""
    params: dict[str, Any] = dict(variant.scalar_params)
    if variant.stdlib == "alibi":
        params["slopes"] = alibi_slopes(num_qo_heads, device)
    return params


@dataclass
class DenseData:
    """One request: q [q_len, H_qo, D], k/v [kv_len, H_kv, D] (NHD), plus parameters."""

    q: Any
    k: Any
    v: Any
    params: dict


@dataclass
class PagedData:
    """A batch over a paged cache [pages, 2, page_size, H_kv, D] in random page order."""

    q: Any
    cache: Any
    qo_indptr: Any
    kv_indptr: Any
    kv_indices: Any
    kv_last_page_len: Any
    kv_lens: list[int]
    params: dict
    dense_k: Any = None
    dense_v: Any = None


def _randn(shape, gen):
    import torch

    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)


def make_dense(case, seed: int) -> DenseData:
    """Random inputs for a single-request prefill case."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    d = case.head_dim
    q = _randn((case.q_len, case.num_qo_heads, d), gen)
    k = _randn((case.kv_len, case.num_kv_heads, d), gen)
    v = _randn((case.kv_len, case.num_kv_heads, d), gen)
    return DenseData(q, k, v, variant_params(case.variant, case.num_qo_heads))


def prefill_set_count(case) -> int:
    """Input sets to rotate for a single-request prefill row (the same count in every process
    that measures the row, so all systems see the same inputs)."""
    from benchmarks.timing import rotation_count

    per_set = 2 * (case.q_len * case.num_qo_heads + 2 * case.kv_len * case.num_kv_heads)
    return rotation_count(per_set * case.head_dim)


def make_prefill_sets(case) -> list[DenseData]:
    """The rotated input sets of a prefill row: ``make_dense(case, seed=i)`` for each i."""
    return [make_dense(case, seed=i) for i in range(prefill_set_count(case))]


def page_table(kv_lens: list[int], page_size: int, seed: int):
    """(kv_indptr, kv_indices, kv_last_page_len, num_pages) as int32 CPU tensors, pages shuffled."""
    import torch

    counts = [-(-n // page_size) for n in kv_lens]
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0).to(torch.int32)
    total = int(indptr[-1])
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randperm(total, generator=gen).to(torch.int32)
    last = torch.tensor(
        [n - (c - 1) * page_size for n, c in zip(kv_lens, counts, strict=True)], dtype=torch.int32
    )
    return indptr, indices, last, total


def make_paged(case, q_lens: list[int], seed: int, dense: bool = False) -> PagedData:
    """Random paged inputs; ``q_lens`` tokens of query per request (1 for decode)."""
    import torch

    kv_lens = list(case.kv_lens) if hasattr(case, "kv_lens") else list(case.lens)
    indptr, indices, last, pages = page_table(kv_lens, case.page_size, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (pages, 2, case.page_size, case.num_kv_heads, case.head_dim)
    cache = _randn(shape, gen)
    q = _randn((sum(q_lens), case.num_qo_heads, case.head_dim), gen)
    qo = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32)
    data = PagedData(
        q=q,
        cache=cache,
        qo_indptr=qo.cuda(),
        kv_indptr=indptr.cuda(),
        kv_indices=indices.cuda(),
        kv_last_page_len=last.cuda(),
        kv_lens=kv_lens,
        params=variant_params(case.variant, case.num_qo_heads),
    )
    if dense and len(set(kv_lens)) == 1:
        data.dense_k, data.dense_v = dense_kv(cache, indices.cuda(), len(kv_lens), kv_lens[0])
    return data


def dense_kv(cache, indices, batch: int, kv_len: int):
    """Dense K and V [B, H_kv, L, D] of equal-length requests, gathered from the pages."""
    pages = indices.long().view(batch, -1)
    out = []
    for which in (0, 1):
        rows = cache[pages, which]  # [B, pages_per_req, page_size, H, D]
        rows = rows.flatten(1, 2)[:, :kv_len]
        out.append(rows.transpose(1, 2).contiguous())
    return out[0], out[1]
