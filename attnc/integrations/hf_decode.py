"""Owns: decode calls of the transformers backend, run over the KV tensors transformers passes
in place (no copy of the cache per step).

transformers hands each layer its whole cache as ``key``/``value`` ``[B, H_kv, KV, D]``. A
call is *decode-shaped* when every batch row is one request whose ``q_len <= 8`` queries are
all valid (the rows of ``generate()`` after the prompt, left padding or not). Such a call is
run by ``attnc.BatchDecodeWrapper`` over a paged HND view of those tensors with one token per
page: page ``p`` starts at token stride ``p``, so row ``b``'s token ``t`` is page
``b * (batch stride / token stride) + t``, and the heads of a page lie at the head stride.
A row's page list is its valid keys only (padding and, for a sliding window, the keys no
query of the call can see are left out), so the kernels read exactly the keys they need. The
decode kernels look a page id up for every KV row whatever the page size, so one token per
page costs no extra loads.

``plan()`` runs once per step and kind of layer: the plan is kept on the step's
:class:`BatchSegments`, and the wrappers come from a pool (one per distinct plan of a step),
kept across steps. Each thread has a pool of its own, so two forward passes in flight at once
(two threads each running ``generate()``) never plan the same wrapper; a thread runs the same
wrappers, with the same workspaces, step after step, and its pool goes when the thread ends.
Without CUDA the same page table feeds the generated reference, so the
CPU tests check the page arithmetic.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from attnc.integrations.hf_masks import BatchSegments
from attnc.integrations.hf_variants import LayerVariant
from attnc.runtime.planning.workspace import CapacityError

MAX_DECODE_Q_LEN = 8
MAX_PAGE_IDS = 2**31 - 1
DECODE_WORKSPACE_BYTES = 128 << 20
_Pool = dict[tuple[Any, ...], list[Any]]


class _ThreadToken:
    """Stands for one thread in :data:`_pools`; only that thread's local data holds it, so its
    pool is dropped when the thread ends."""

    __slots__ = ("__weakref__",)


_thread = threading.local()
# Each thread's decode wrappers, by pool key (see _thread_pool).
_pools: MutableMapping[_ThreadToken, _Pool] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class TokenPages:
    """A decode call as a paged HND cache of one token per page: the K/V page views
    ``[num_pages, H_kv, 1, D]`` and the page table (host int32)."""

    k_pages: torch.Tensor
    v_pages: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    q_len: int
    row_pages: int  # pages between the first tokens of consecutive rows


def is_decode_call(segments: BatchSegments, q_len: int) -> bool:
    """Every batch row one request whose ``q_len`` (1..8) queries are all valid."""
    key = ("decode-shaped", q_len)
    known = segments.plans.get(key)
    if known is None:
        known = (
            1 <= q_len <= MAX_DECODE_Q_LEN
            and len(segments.segments) == segments.batch_size
            and all(
                s.row == b
                and s.q_begin == 0
                and s.q_end == q_len
                and s.kv_end - s.kv_begin >= q_len
                for b, s in enumerate(segments.segments)
            )
        )
        segments.plans[key] = known
    return bool(known)


def token_pages(
    key: torch.Tensor, value: torch.Tensor, segments: BatchSegments, window: int | None
) -> TokenPages | None:
    """The page view and table of a decode-shaped call (None when ``key`` and ``value`` do not
    allow one: equal strides, a contiguous last dim, a batch stride that is a multiple of the
    token stride, token and head strides of whole 16-byte chunks, 16-byte aligned starts and
    fewer than 2**31 pages)."""
    if key.stride() != value.stride() or key.dim() != 4 or key.stride(3) != 1:
        return None
    batch, hkv, kv_len, head_dim = key.shape
    s_batch, s_head, s_tok, _ = key.stride()
    if s_tok <= 0 or s_batch % s_tok or s_tok % 8 or s_head % 8:
        return None
    if key.data_ptr() % 16 or value.data_ptr() % 16:
        return None
    row_pages = s_batch // s_tok
    num_pages = (batch - 1) * row_pages + kv_len
    if num_pages > MAX_PAGE_IDS:  # page ids are int32
        return None
    size, stride = (num_pages, hkv, 1, head_dim), (s_tok, s_head, s_tok, 1)
    try:
        k_pages = key.as_strided(size, stride, key.storage_offset())
        v_pages = value.as_strided(size, stride, value.storage_offset())
    except RuntimeError:  # the view would reach past the storage
        return None
    indptr, indices, last = _page_table(segments, row_pages, window)
    return TokenPages(k_pages, v_pages, indptr, indices, last, segments.q_len, row_pages)


def _page_table(
    segments: BatchSegments, row_pages: int, window: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kv_indptr``, ``kv_indices``, ``kv_last_page_len`` (host int32) of the step's rows,
    built once per step, row stride and window (the layers of a kind share them)."""
    key = ("token page table", row_pages, window)
    table = segments.plans.get(key)
    if table is not None:
        return table  # type: ignore[no-any-return]
    q_len = segments.q_len
    starts, lengths = [], []
    for s in segments.segments:
        begin = s.kv_begin
        if window is not None:  # keys before the first query's window are never seen
            begin = max(begin, s.kv_end - q_len - window + 1)
        starts.append(s.row * row_pages + begin)
        lengths.append(s.kv_end - begin)
    lens = torch.tensor(lengths, dtype=torch.int64, device="cpu")
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int64, device="cpu")
    indptr[1:] = lens.cumsum(0)
    total = int(indptr[-1])
    offsets = torch.arange(total, dtype=torch.int64, device="cpu") - torch.repeat_interleave(
        indptr[:-1], lens
    )
    indices = (
        torch.repeat_interleave(torch.tensor(starts, dtype=torch.int64, device="cpu"), lens)
        + offsets
    )
    table = (
        indptr.to(torch.int32),
        indices.to(torch.int32),
        torch.ones(len(lengths), dtype=torch.int32, device="cpu"),
    )
    segments.plans[key] = table
    return table


def decode_queries(query: torch.Tensor) -> torch.Tensor:
    """``[B, H_qo, Q, D]`` -> ``[B * Q, H_qo, D]`` (a view when Q == 1)."""
    batch, hq, q_len, head_dim = query.shape
    return query.transpose(1, 2).reshape(batch * q_len, hq, head_dim)


def run_decode_reference(
    choice: LayerVariant, pages: TokenPages, q: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """Each request through the generated reference over the keys its page list names."""
    variant, params = choice.variant, choice.run_params()
    indptr, ids = pages.kv_indptr.tolist(), pages.kv_indices.to(torch.int64)
    outs = []
    for b in range(len(indptr) - 1):
        rows = ids[indptr[b] : indptr[b + 1]].to(pages.k_pages.device)
        k = pages.k_pages[rows, :, 0]
        v = pages.v_pages[rows, :, 0]
        qb = q[b * pages.q_len : (b + 1) * pages.q_len]
        outs.append(variant.reference(qb, k, v, sm_scale=scaling, **params))
    return torch.cat(outs, dim=0)


def run_decode_kernels(
    choice: LayerVariant,
    segments: BatchSegments,
    pages: TokenPages,
    q: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor | None:
    """The call through ``attnc.BatchDecodeWrapper`` (planned once per step and plan key);
    None when the step exceeds a wrapper's capacity (page ids or work items: the caller
    packs instead)."""
    hq, hkv, head_dim = q.shape[1], pages.k_pages.shape[1], q.shape[2]
    pool_key = (choice.spec, hq, hkv, head_dim, q.dtype, scaling, q.device)
    plan_key = (*pool_key, "decode", choice.window, pages.row_pages, pages.k_pages.shape[0])
    wrapper = segments.plans.get(plan_key)
    if wrapper is False:  # this step's plan did not fit
        return None
    if wrapper is None:
        batch = pages.kv_last_page_len.shape[0]
        wrapper = _pooled_wrapper(choice, pool_key, segments, batch)
        if pages.kv_indices.shape[0] > wrapper.layout.max_pages:
            segments.plans[plan_key] = False
            return None
        try:
            wrapper.plan(
                pages.kv_indptr,
                pages.kv_indices,
                pages.kv_last_page_len,
                hq,
                hkv,
                head_dim,
                1,
                q_len_per_request=pages.q_len,
                sm_scale=scaling,
                dtype=q.dtype,
            )
        except CapacityError:  # more work items than the wrapper holds: pack instead
            segments.plans[plan_key] = False
            return None
        segments.plans[plan_key] = wrapper
    out: torch.Tensor = wrapper.run(q, (pages.k_pages, pages.v_pages), **choice.run_params())
    return out


def _pooled_wrapper(
    choice: LayerVariant, pool_key: tuple[Any, ...], segments: BatchSegments, batch: int
) -> Any:
    """The step's next unused decode wrapper of ``pool_key`` in the calling thread's pool
    (made when the pool runs short or its wrappers hold fewer requests than ``batch``)."""
    import attnc

    taken_key = ("decode wrappers taken", pool_key)
    taken = segments.plans.get(taken_key, 0)
    segments.plans[taken_key] = taken + 1
    pool = _thread_pool().setdefault(pool_key, [])
    if taken < len(pool) and pool[taken].layout.max_batch >= batch:
        return pool[taken]
    workspace = torch.empty(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=pool_key[-1])
    wrapper = attnc.BatchDecodeWrapper(
        choice.variant, workspace, "HND", max_batch_size=max(256, batch)
    )
    if taken < len(pool):
        pool[taken] = wrapper
    else:
        pool.append(wrapper)
    return wrapper


def _thread_pool() -> _Pool:
    """The calling thread's decode wrappers, by pool key. A step's forward runs in one thread,
    and the step counter of :func:`_pooled_wrapper` indexes only that thread's wrappers, so a
    forward in another thread never re-plans one between this step's layers."""
    token = getattr(_thread, "token", None)
    if token is None:
        token = _thread.token = _ThreadToken()
    pool = _pools.get(token)
    if pool is None:
        pool = _pools[token] = {}
    return pool


def release_decode_wrappers() -> None:
    """Drop the pooled decode wrappers (and their workspaces) of every device and thread (a
    step in flight keeps the wrappers it already planned)."""
    _pools.clear()
