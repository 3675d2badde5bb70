"""Owns: the fields of ``AttncDecodeArgs``: the plan-fixed half (workspace pointers, heads,
grid; ``fill_plan_fields``, written by each checked ``plan()``) and the per-call half (the
q/k/v/o/lse pointers, strides and params struct; ``fill_call_fields``), and the current CUDA
stream handed to the launcher.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import torch

from attnc.runtime import abi
from attnc.runtime.abi import FLAG_MERGE, AttncDecodeArgs
from attnc.runtime.checks.kv import KvViews
from attnc.runtime.checks.page_status import pool_size
from attnc.runtime.checks.tensors import check_param_memory
from attnc.runtime.planning.workspace import WorkspaceLayout
from attnc.runtime.wrappers.cuda_stream import raw_stream
from attnc.runtime.wrappers.decode_plan_inputs import DecodeShape

# O's strides (but the last dim's) are whole multiples of this many elements (decode_launcher.cuh).
DECODE_O_STRIDE_MULTIPLE = 4

__all__ = ["fill_call_fields", "fill_plan_fields", "raw_stream"]


def fill_plan_fields(
    args: AttncDecodeArgs,
    layout: WorkspaceLayout,
    base: int,
    shape: DecodeShape,
    *,
    kv_layout: str,
    token_starts: bool,
    merge_ctas: int,
    merge: bool,
    params_size: int,
) -> None:
    """Write a checked plan's fields into ``args``: the workspace regions' addresses (from
    ``base``; ``kv_token_start`` only with ``token_starts``), the heads, page size, KV layout
    and grid of ``shape``, the merge CTAs and flag, and the params struct's size."""
    a, lay = args, layout
    a.header = base + lay.header
    a.cta_indptr = base + lay.cta_indptr
    a.items = base + lay.items
    a.req_page_begin = base + lay.req_page_begin
    a.req_kv_len = base + lay.req_kv_len
    a.page_ids = base + lay.page_ids
    a.kv_token_start = base + lay.kv_token_start if token_starts else None
    a.merge_items = base + lay.merge_items
    a.part_o = base + lay.partials
    a.part_lse = base + lay.part_lse_offset(shape.head_dim)
    a.num_qo_heads = shape.num_qo_heads
    a.num_kv_heads = shape.num_kv_heads
    a.head_dim = shape.head_dim
    a.page_size = shape.page_size
    a.kv_layout = abi.paged_kv_code(kv_layout)
    a.rows_per_item = shape.rows_per_item
    a.num_ctas = shape.num_ctas
    a.merge_ctas = merge_ctas
    a.flags = FLAG_MERGE if merge else 0
    a.sm_scale = shape.sm_scale
    a.variant_params_size = params_size


def fill_call_fields(
    args: AttncDecodeArgs,
    q: torch.Tensor,
    views: KvViews,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    params: ctypes.Structure,
) -> None:
    """Write the tensors' pointers and strides, the cache's page count and the params
    struct's address into ``args`` (the KV strides as (page, token, head) for either paged
    layout)."""
    a, k = args, views.k
    a.num_pages = pool_size(views.num_pages)
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), views.v.data_ptr(), o.data_ptr()
    a.lse = lse.data_ptr() if lse is not None else None
    a.q_stride_tok, a.q_stride_head = q.stride(0), q.stride(1)
    a.o_stride_tok, a.o_stride_head = o.stride(0), o.stride(1)
    a.kv_stride_page = k.stride(0)
    if views.layout == abi.KV_PAGED_NHD:
        a.kv_stride_tok, a.kv_stride_head = k.stride(1), k.stride(2)
    else:
        a.kv_stride_tok, a.kv_stride_head = k.stride(2), k.stride(1)
    a.variant_params = ctypes.addressof(params)


class ParamsPacker:
    """Packs resolved param values into the module's ``Params`` struct (``abi.fill_params``),
    once per checked call; a variant whose params all take their defaults reuses one
    struct of the defaults."""

    def __init__(self, decls: Sequence[object]) -> None:
        self.decls = decls
        self._defaults: ctypes.Structure | None = None

    def pack(
        self, struct_type: type[ctypes.Structure], values: Mapping[str, object]
    ) -> ctypes.Structure:
        """The struct of ``values``; an empty ``values`` means every param's default."""
        if values:
            check_param_memory(values, packed=True)
            return abi.fill_params(struct_type, self.decls, values)  # type: ignore[arg-type]
        found = self._defaults
        if found is None or type(found) is not struct_type:
            defaults = {d.name: d.default for d in self.decls}  # type: ignore[attr-defined]
            found = self._defaults = abi.fill_params(struct_type, self.decls, defaults)  # type: ignore[arg-type]
        return found
