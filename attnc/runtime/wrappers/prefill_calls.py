"""Owns: the eager call memo of ``BatchPrefillWrapper.run()`` within one plan.

A model calls ``run()`` once per layer with tensors of the same shapes: each layer its own q,
output and KV cache. After a fully checked call, ``run()`` remembers the launch argument
struct it built, keyed by what its checks looked at (``call_keys.call_key``: q, ``out`` and
the KV tensors by shape, strides, dtype and device, not by address; params by value, or by
identity and address for tensors). A later call of the same plan with the same key is
launched from a copy of that struct with the new q / K / V / O / LSE addresses, after
only the tests that ``out`` does not overlap q, K or V, that none of them lies in the
workspace (byte spans at the new addresses; a call that fails them is checked in full,
which names the problem) and, when the plan was given mask params, that they are
unchanged. ``plan()`` empties the memo, so every check that
depends on the plan (row and token counts, page range, batch-sized params) holds for an
entry as long as it lives.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnc.runtime.abi import AttncPrefillArgs
from attnc.runtime.checks.kv import KvViews
from attnc.runtime.checks.tensors import VECTOR_ALIGN_BYTES
from attnc.runtime.wrappers.call_keys import (
    byte_span,
    call_key,
    overlaps_any,
    param_ranges,
    tensor_meta,
)

MAX_MEMO_CALLS = 64


@dataclass(frozen=True)
class MemoCall:
    """A checked call's launch struct (its q/k/v/o/lse addresses are rewritten per call),
    the objects it points into (the params struct, the params' tensors), K's and V's byte
    offsets from the addresses of the ``kv`` argument's tensors, the byte spans of q, K, V
    and ``out`` (0 without ``out``), the workspace's bytes and the resolved param values
    (for the planned-mask test)."""

    args: bytes
    params_struct: ctypes.Structure
    params: dict[str, object]
    values: Mapping[str, object]
    k_offset: int
    v_offset: int
    q_span: int
    k_span: int
    v_span: int
    o_span: int
    workspace: tuple[int, int]  # [start, end) addresses
    param_ranges: tuple[tuple[int, int], ...] = ()  # the tensor params' bytes


def memo_key(
    q: object, kv: object, out: object, return_lse: bool, params: Mapping[str, object]
) -> tuple[object, ...] | None:
    """The memo key of a call, or None when it is not memoised."""
    return call_key(q, kv, out, return_lse, params, kv_key=tensor_meta)


def kv_addresses(kv: object) -> tuple[int, int]:
    """The addresses K and V are measured from: a ``(k, v)`` tuple's two tensors, or one
    cache tensor's (a key was made, so ``kv`` is one of the two forms)."""
    if isinstance(kv, torch.Tensor):
        base = kv.data_ptr()
        return base, base
    return kv[0].data_ptr(), kv[1].data_ptr()  # type: ignore[index]


def remember(
    args: AttncPrefillArgs,
    kv: object,
    views: KvViews,
    memory: tuple[torch.Tensor, torch.Tensor | None, tuple[int, int]],
    struct: ctypes.Structure,
    params: Mapping[str, object],
    values: Mapping[str, object],
) -> MemoCall | None:
    """The memo entry of the checked call launched with ``args``, or None when it may not be
    memoised: a tensor param or K / V was replaced by a copy (a later call would not see
    the caller's tensor), or K / V do not lie at fixed offsets from the ``kv`` tensors.
    ``memory``: the call's q and ``out`` and the workspace's bytes ``[start, end)``."""
    for name, given in params.items():
        if isinstance(given, torch.Tensor) and values.get(name) is not given:
            return None
    if isinstance(kv, (tuple, list)) and (views.k is not kv[0] or views.v is not kv[1]):
        return None
    q, out, workspace = memory
    k_base, v_base = kv_addresses(kv)
    k_offset, v_offset = views.k.data_ptr() - k_base, views.v.data_ptr() - v_base
    spans = (byte_span(q), byte_span(views.k), byte_span(views.v))
    o_span = 0 if out is None else byte_span(out)
    return MemoCall(
        bytes(args), struct, dict(params), values, k_offset, v_offset, *spans, o_span, workspace,
        param_ranges(values),
    )  # fmt: skip


def replay_args(
    hit: MemoCall, q: torch.Tensor, kv: object, out: torch.Tensor | None
) -> AttncPrefillArgs | None:
    """The launch struct of ``hit`` with this call's q / K / V addresses (O and LSE are the
    caller's to set), or None when at these addresses ``out`` may overlap q, K or V, or one
    of them the workspace, or one of them is not 16-byte aligned (the checked call names
    it)."""
    k_base, v_base = kv_addresses(kv)
    q_ptr, k_ptr, v_ptr = q.data_ptr(), k_base + hit.k_offset, v_base + hit.v_offset
    if (q_ptr | k_ptr | v_ptr) % VECTOR_ALIGN_BYTES:
        return None
    ws, ws_end = hit.workspace
    q_end, k_end, v_end = q_ptr + hit.q_span, k_ptr + hit.k_span, v_ptr + hit.v_span
    if (q_ptr < ws_end and ws < q_end) or (k_ptr < ws_end and ws < k_end):
        return None
    if v_ptr < ws_end and ws < v_end:
        return None
    if out is not None:
        o_ptr = out.data_ptr()
        if o_ptr % VECTOR_ALIGN_BYTES:
            return None
        o_end = o_ptr + hit.o_span
        if (o_ptr < q_end and q_ptr < o_end) or (o_ptr < k_end and k_ptr < o_end):
            return None
        if (o_ptr < v_end and v_ptr < o_end) or (o_ptr < ws_end and ws < o_end):
            return None
        if overlaps_any(o_ptr, o_end, hit.param_ranges):
            return None
    args = AttncPrefillArgs.from_buffer_copy(hit.args)
    args.q, args.k, args.v = q_ptr, k_ptr, v_ptr
    return args
