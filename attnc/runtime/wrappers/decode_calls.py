"""Owns: the eager call cache of ``BatchDecodeWrapper.run()``.

After a fully checked call, ``run()`` remembers the per-call fields of the decode argument
struct (K/V pointers, strides, the params struct) keyed by what its checks looked at: q and
out by shape, strides, dtype and device, the KV cache also by data pointer, scalar params by
type and value, tensor params by identity and data pointer. A later call with the same key
re-checks only what depends on the current plan (row count, page range) and whether at the
new addresses q or ``out`` may lie in the workspace or ``out`` overlap q or the KV cache
(``may_alias``: the call is then checked in full, which names the problem), writes the
q/o/lse pointers and launches.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnc.runtime.abi import AttncDecodeArgs
from attnc.runtime.checks.page_status import pool_size
from attnc.runtime.wrappers.call_keys import byte_span, overlaps_any, param_ranges, tensor_key

MAX_CACHED_CALLS = 128


@dataclass(frozen=True)
class CachedCall:
    """The per-call fields of a checked ``run()``, with the objects the params struct points
    into, the byte spans of q and out (0 without out) and the KV cache's bytes (for the
    overlap checks of later calls)."""

    q_rows: int
    num_pages: int
    k: int
    v: int
    q_stride_tok: int
    q_stride_head: int
    o_stride_tok: int
    o_stride_head: int
    kv_stride_page: int
    kv_stride_tok: int
    kv_stride_head: int
    variant_params: int
    params_struct: ctypes.Structure
    params: dict[str, object]
    q_span: int
    o_span: int
    kv_range: tuple[int, int] = (0, 0)  # [start, end) addresses
    param_ranges: tuple[tuple[int, int], ...] = ()  # the tensor params' bytes


def remember_call(
    args: AttncDecodeArgs,
    q: torch.Tensor,
    out: torch.Tensor | None,
    num_pages: int,
    struct: ctypes.Structure,
    params: Mapping[str, object],
    values: Mapping[str, object],
    kv_range: tuple[int, int] = (0, 0),
) -> CachedCall | None:
    """The cache entry of the checked call whose fields are in ``args``, or None when it may
    not be cached: a tensor param was replaced by a copy (a later in-place update of the
    caller's tensor would not be seen through the copy). ``kv_range``: the KV cache's
    bytes ``[start, end)``."""
    for name, given in params.items():
        if isinstance(given, torch.Tensor) and values.get(name) is not given:
            return None
    a = args
    # The entry keeps the params struct and the param tensors alive (ids are not reused).
    return CachedCall(
        q.shape[0], num_pages, a.k, a.v, a.q_stride_tok, a.q_stride_head, a.o_stride_tok,
        a.o_stride_head, a.kv_stride_page, a.kv_stride_tok, a.kv_stride_head,
        a.variant_params, struct, dict(params),
        byte_span(q), 0 if out is None else byte_span(out), kv_range, param_ranges(values),
    )  # fmt: skip


def may_alias(hit: CachedCall, q_ptr: int, out_ptr: int | None, workspace: tuple[int, int]) -> bool:
    """Whether, with the spans of ``hit`` at this call's addresses, q or ``out`` may lie in
    the ``workspace`` bytes, or ``out`` overlap q or the KV cache."""
    ws, ws_end = workspace
    q_end = q_ptr + hit.q_span
    if q_ptr < ws_end and ws < q_end:
        return True
    if out_ptr is None:
        return False
    o_end = out_ptr + hit.o_span
    kv, kv_end = hit.kv_range
    return (
        (out_ptr < q_end and q_ptr < o_end)
        or (out_ptr < kv_end and kv < o_end)
        or (out_ptr < ws_end and ws < o_end)
        or overlaps_any(out_ptr, o_end, hit.param_ranges)
    )


def apply_call(args: AttncDecodeArgs, hit: CachedCall) -> None:
    """Write the cached per-call fields of ``hit`` into ``args`` (all but q/o/lse; with the
    cache's page count for the device page-id check)."""
    a = args
    a.num_pages = pool_size(hit.num_pages)
    a.k, a.v = hit.k, hit.v
    a.q_stride_tok, a.q_stride_head = hit.q_stride_tok, hit.q_stride_head
    a.o_stride_tok, a.o_stride_head = hit.o_stride_tok, hit.o_stride_head
    a.kv_stride_page, a.kv_stride_tok = hit.kv_stride_page, hit.kv_stride_tok
    a.kv_stride_head = hit.kv_stride_head
    a.variant_params = hit.variant_params


def kv_identity(kv: object) -> tuple[object, ...]:
    """What identifies a KV cache argument between two calls: each tensor's data pointer,
    shape, strides, dtype, device and negative bit (``tensor_key``; the same object with
    another dtype or strides, after ``.data =`` or ``as_strided_``, needs its views checked
    again, and so does a list whose element became a negated view of the same bytes)."""
    if isinstance(kv, torch.Tensor):
        return _kv_key(kv)
    if (
        isinstance(kv, (tuple, list))
        and len(kv) == 2
        and all(isinstance(t, torch.Tensor) for t in kv)
    ):
        return (_kv_key(kv[0]), _kv_key(kv[1]))
    return (id(kv),)


def _kv_key(t: torch.Tensor) -> tuple[object, ...]:
    return (*tensor_key(t), t.is_neg())
