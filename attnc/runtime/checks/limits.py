"""Owns: the checks that a batch fits the kernels' 32-bit indices (KV and query tokens per
request, and KV tokens per batch for a variant that reads a ``kv_len`` tensor).

The kernels index tokens with int32; a count past ``2**31 - 1`` would wrap silently on the
device, so it is a ``ValueError`` naming the argument on the host. A request's KV keeps a
margin below that (:data:`MAX_KV_TOKENS`): the kernels step over a request's keys in tiles
(``kv0 + tile``, ``(end - begin + tile - 1) / tile``), which wrapped for a request within a
tile of ``2**31`` tokens (reachable with repeated page ids, without the memory).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnc.dsl.limits import MAX_KV_TOKENS, MAX_QUERY_TOKENS
from attnc.runtime.checks import page_table
from attnc.runtime.checks.tensors import I32_MAX


def check_paged_kv_tokens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> None:
    """Every request's KV (:func:`paged_kv_tokens`) is at most :data:`MAX_KV_TOKENS` (host
    int64 copies of checked index tensors)."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    tokens = paged_kv_tokens(kv_indptr, kv_last_page_len, page_size)
    _check_request_tokens(
        tokens,
        "kv_indptr",
        "KV",
        MAX_KV_TOKENS,
        lambda i: page_table.pages_detail(int(pages[i]), page_size),
    )


def paged_kv_tokens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Each request's KV tokens in a paged cache, ``(pages - 1) * page_size + last``, 0 for a
    request without pages (``pages = kv_indptr[i + 1] - kv_indptr[i]``; the host planners'
    ``paged_kv_len`` in ``attnc/kernels/host/page_table_check.h``)."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.where(pages > 0, (pages - 1) * page_size + kv_last_page_len, 0)


def check_ragged_kv_tokens(kv_indptr: torch.Tensor) -> None:
    """Every request's ragged KV, ``kv_indptr[i + 1] - kv_indptr[i]``, is at most
    :data:`MAX_KV_TOKENS` (a k of that many rows needs no memory as a zero-stride view)."""
    _check_indptr_tokens(kv_indptr, "kv_indptr", "KV", MAX_KV_TOKENS)


def check_query_tokens(qo_indptr: torch.Tensor) -> None:
    """Every request's queries, ``qo_indptr[i + 1] - qo_indptr[i]``, are at most
    :data:`MAX_QUERY_TOKENS` (the index check's bounds of ``q_pos`` rest on it)."""
    _check_indptr_tokens(qo_indptr, "qo_indptr", "query", MAX_QUERY_TOKENS)


def check_single_request(q_len: int, kv_len: int) -> None:
    """One request given as tensors (``Variant.prefill``): q's rows within
    :data:`MAX_QUERY_TOKENS` and k's within :data:`MAX_KV_TOKENS` (a zero-stride view holds
    that many rows without the memory)."""
    for name, what, rows, limit in (
        ("q", "query", q_len, MAX_QUERY_TOKENS),
        ("k", "KV", kv_len, MAX_KV_TOKENS),
    ):
        if rows > limit:
            raise ValueError(
                f"{name}: holds {rows} {what} tokens, more than the kernels' limit {limit} "
                "(int32 less a margin for their tile arithmetic)"
            )


def _check_indptr_tokens(indptr: torch.Tensor, name: str, what: str, limit: int) -> None:
    """Each request of a checked token indptr (from 0, non-decreasing) within ``limit``; no
    request holds more than the total, so a total within it needs no per-request look."""
    if int(indptr[-1]) > limit:
        tokens = indptr[1:].long() - indptr[:-1].long()
        _check_request_tokens(tokens, name, what, limit, lambda i: "")


def _check_request_tokens(
    tokens: torch.Tensor, name: str, what: str, limit: int, detail: Callable[[int], str]
) -> None:
    """Each request's ``tokens`` (``what`` tokens of ``name``) within ``limit``; ``detail(i)``
    says more of request i in the error."""
    if tokens.numel() and int(tokens.max()) > limit:
        i = int(torch.argmax(tokens))  # the first of the longest, as the host planners
        raise page_table.too_many_tokens(name, what, i, int(tokens[i]), limit, detail(i))


def kv_tokens_past_int32(total_kv: int) -> ValueError:
    """A batch whose KV tokens together do not fit the int32 ``kv_token_start`` (and indices)
    of a ``kv_len`` tensor param."""
    return ValueError(
        f"kv_indptr: the batch holds {total_kv} KV tokens, more than the kernels' int32 limit "
        f"{I32_MAX} for a variant that reads a kv_len tensor (its entries are indexed over "
        f"the whole batch); plan fewer requests per step"
    )
