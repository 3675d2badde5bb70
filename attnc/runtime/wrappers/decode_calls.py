"""Owns: the eager call cache of ``BatchDecodeWrapper.run()``.

After a fully checked call, ``run()`` remembers the per-call fields of the decode argument
struct (K/V pointers, strides, the params struct) keyed by what its checks looked at: q and
out by shape, strides, dtype and device, the KV cache also by data pointer, scalar params by
type and value, tensor params by identity and data pointer. A later call with the same key
re-checks only what depends on the current plan (row count, page range) and whether ``out``
overlaps ``q``, writes the q/o/lse pointers and launches.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnc.runtime.abi import AttncDecodeArgs
from attnc.runtime.checks.page_status import pool_size
from attnc.runtime.checks.tensors import is_dense

MAX_CACHED_CALLS = 128
_SCALAR_TYPES = (int, float, bool)


@dataclass(frozen=True)
class CachedCall:
    """The per-call fields of a checked ``run()``, with the objects the params struct points
    into, and the byte spans of q and out (for the overlap check of later calls)."""

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


def byte_span(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past the last element ``t`` can address."""
    if t.is_contiguous():
        return t.numel() * t.element_size()
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def remember_call(
    args: AttncDecodeArgs,
    q: torch.Tensor,
    out: torch.Tensor | None,
    num_pages: int,
    struct: ctypes.Structure,
    params: Mapping[str, object],
    values: Mapping[str, object],
) -> CachedCall | None:
    """The cache entry of the checked call whose fields are in ``args``, or None when it may
    not be cached: a tensor param was replaced by a copy (a later in-place update of the
    caller's tensor would not be seen through the copy). The byte spans of q and ``out``
    are kept only when the call had an ``out`` (later calls check it does not overlap q)."""
    for name, given in params.items():
        if isinstance(given, torch.Tensor) and values.get(name) is not given:
            return None
    a = args
    # The entry keeps the params struct and the param tensors alive (ids are not reused).
    return CachedCall(
        q.shape[0], num_pages, a.k, a.v, a.q_stride_tok, a.q_stride_head, a.o_stride_tok,
        a.o_stride_head, a.kv_stride_page, a.kv_stride_tok, a.kv_stride_head,
        a.variant_params, struct, dict(params),
        0 if out is None else byte_span(q), 0 if out is None else byte_span(out),
    )  # fmt: skip


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


def spans_overlap(a_ptr: int, a_span: int, b_ptr: int, b_span: int) -> bool:
    """True when the byte ranges ``[a_ptr, a_ptr + a_span)`` and ``[b_ptr, b_ptr + b_span)``
    share a byte."""
    return a_ptr < b_ptr + b_span and b_ptr < a_ptr + a_span and a_span > 0 and b_span > 0


def tensor_key(t: torch.Tensor) -> tuple[object, ...]:
    """A tensor by data pointer, shape, strides, dtype and device."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


def call_key(
    q: object, kv: object, out: object, return_lse: bool, params: Mapping[str, object]
) -> tuple[object, ...] | None:
    """Everything the checks of ``run()`` depend on, or None when the call is not cacheable
    (see the module docstring)."""
    if not isinstance(q, torch.Tensor) or not is_dense(q):
        return None
    if out is None:
        out_key: object = None
    elif isinstance(out, torch.Tensor) and is_dense(out):
        out_key = (out.shape, out.stride(), out.dtype, out.device)
    else:
        return None
    if isinstance(kv, torch.Tensor) and is_dense(kv):
        kv_key: object = tensor_key(kv)
    elif (
        isinstance(kv, (tuple, list))
        and len(kv) == 2
        and isinstance(kv[0], torch.Tensor)
        and isinstance(kv[1], torch.Tensor)
        and is_dense(kv[0])
        and is_dense(kv[1])
    ):
        kv_key = (tensor_key(kv[0]), tensor_key(kv[1]))
    else:
        return None
    param_key: list[object] = []
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            if not is_dense(value):
                return None
            param_key.append((name, id(value), value.data_ptr()))
        elif type(value) in _SCALAR_TYPES:
            param_key.append((name, type(value), value))
        else:
            return None
    return (q.shape, q.stride(), q.dtype, q.device, kv_key, out_key, return_lse, *param_key)


def kv_identity(kv: object) -> tuple[int, ...]:
    """What identifies a KV cache argument between two calls (data pointers and shape)."""
    if isinstance(kv, torch.Tensor):
        return (kv.data_ptr(), *kv.shape)
    if (
        isinstance(kv, (tuple, list))
        and len(kv) == 2
        and all(isinstance(t, torch.Tensor) for t in kv)
    ):
        return (kv[0].data_ptr(), kv[1].data_ptr(), *kv[0].shape)
    return (id(kv),)
