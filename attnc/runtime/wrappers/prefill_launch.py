"""Launching a prefill module: eager calls go straight to ctypes; under ``torch.compile`` the
same launch runs inside one generic custom op, ``attnc::prefill``, keyed by the module id.

``meta`` is the int list a plan hands to every launch (see ``META_FIELDS``). Param values
arrive resolved (``checks.params.resolve_params``) and are packed once per launch by
``pack_params`` (``abi.fill_params``); through the custom op they travel as
``params_lists`` lists and are packed inside it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from attnc.compiler import ir
from attnc.runtime import abi
from attnc.runtime.build.modules import PrefillModule, module_by_id
from attnc.runtime.checks.page_status import pool_size
from attnc.runtime.checks.tensors import check_param_memory
from attnc.runtime.variant import live_variant
from attnc.runtime.wrappers.cuda_stream import raw_stream
from attnc.runtime.wrappers.op_fakes import attention_outputs, register_attention_fake
from attnc.runtime.wrappers.params_lists import join_params

# O's strides (but the last dim's) are whole multiples of this many elements (prefill_launcher.cuh).
PREFILL_O_STRIDE_MULTIPLE = 2

if TYPE_CHECKING:
    from attnc.runtime.planning.prefill_plan import HostPlan

META_FIELDS = (
    "batch_size",
    "num_work",
    "num_merge",
    "tile_q_tokens",
    "page_size",
    "kv_layout",
    "num_qo_heads",
    "num_kv_heads",
    "head_dim",
    "off_qo_indptr",
    "off_kv_indptr",
    "off_kv_indices",  # -1: none (ragged)
    "off_kv_last_page_len",  # -1: none (ragged)
    "off_items",
    "off_merge_items",
    "off_part_o",
    "off_part_lse",
    "page_status",  # address of the wrapper's page-status word (checks/page_status.py); 0: none
    "off_kv_token_start",
    "off_tile_map",  # -1: no tile map (tile classes from V::classify)
    "off_tile_map_start",  # -1: no tile map
    "tile_map_kv_block",
)


class PrefillTensors(NamedTuple):
    """The tensors of one launch: inputs, outputs (``lse`` None: not written) and the
    workspace that holds the plan's lists and split-KV partial states."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor | None
    workspace: torch.Tensor


def _kv_strides(k: torch.Tensor, kv_layout: int) -> tuple[int, int, int]:
    """(page, token, head) strides of one K/V half."""
    if kv_layout == abi.KV_RAGGED:
        return 0, k.stride(0), k.stride(1)
    if kv_layout == abi.KV_PAGED_NHD:
        return k.stride(0), k.stride(1), k.stride(2)
    return k.stride(0), k.stride(2), k.stride(1)


@functools.lru_cache(maxsize=64)
def _plan_fields(meta: tuple[int, ...], workspace_ptr: int) -> abi.AttncPrefillArgs:
    """``AttncPrefillArgs`` with the fields a plan fixes (``meta``: sizes, layout, the lists'
    places in the workspace at ``workspace_ptr``) set and the per-call ones zero; kept for
    the plans in use, so a launch copies it instead of filling every field again."""
    m = dict(zip(META_FIELDS, meta, strict=True))

    def at(name: str) -> int | None:
        off = m[name]
        return None if off < 0 else workspace_ptr + off

    return abi.AttncPrefillArgs(
        qo_indptr=at("off_qo_indptr"),
        kv_indptr=at("off_kv_indptr"),
        kv_indices=at("off_kv_indices"),
        kv_last_page_len=at("off_kv_last_page_len"),
        items=at("off_items"),
        merge_items=at("off_merge_items"),
        part_o=at("off_part_o"),
        part_lse=at("off_part_lse"),
        batch_size=m["batch_size"],
        num_work=m["num_work"],
        num_merge=m["num_merge"],
        num_qo_heads=m["num_qo_heads"],
        num_kv_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        page_size=m["page_size"],
        kv_layout=m["kv_layout"],
        tile_q_tokens=m["tile_q_tokens"],
        page_status=m["page_status"] or None,
        kv_token_start=at("off_kv_token_start"),
        tile_map=at("off_tile_map"),
        tile_map_start=at("off_tile_map_start"),
        tile_map_kv_block=m["tile_map_kv_block"],
    )


_KV_LAYOUT = META_FIELDS.index("kv_layout")
_HEADS = slice(META_FIELDS.index("num_qo_heads"), META_FIELDS.index("head_dim") + 1)


def build_args(
    meta: Sequence[int],
    tensors: PrefillTensors,
    sm_scale: float,
    params: ctypes.Structure,
    params_size: int,
) -> abi.AttncPrefillArgs:
    """Fill ``AttncPrefillArgs`` from tensors, the plan's ``meta`` and a params struct."""
    q, k, v, o, lse, workspace = tensors
    args = abi.AttncPrefillArgs.from_buffer_copy(_plan_fields(tuple(meta), workspace.data_ptr()))
    args.q, args.k, args.v, args.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    args.lse = None if lse is None else lse.data_ptr()
    args.q_stride_tok, args.q_stride_head = q.stride(0), q.stride(1)
    args.o_stride_tok, args.o_stride_head = o.stride(0), o.stride(1)
    page, tok, head = _kv_strides(k, meta[_KV_LAYOUT])
    args.kv_stride_page, args.kv_stride_tok, args.kv_stride_head = page, tok, head
    args.sm_scale = sm_scale
    args.variant_params = ctypes.addressof(params)
    args.variant_params_size = params_size
    args.num_pages = pool_size(k.shape[0])  # paged: pages; ragged: tokens
    return args


def launch(
    module: PrefillModule,
    meta: Sequence[int],
    tensors: PrefillTensors,
    sm_scale: float,
    params: ctypes.Structure,
) -> abi.AttncPrefillArgs:
    """Run the module on the current CUDA stream, writing ``tensors.o`` (and ``tensors.lse``
    when given); ``params`` is the packed ``Params`` struct (``pack_params``). Returns the
    argument struct it launched with."""
    size = ctypes.sizeof(module.params_type)
    args = build_args(meta, tensors, sm_scale, params, size)
    launch_args(module, meta, args, tensors.q.device, tensors.lse)
    return args


def launch_args(
    module: PrefillModule,
    meta: Sequence[int],
    args: abi.AttncPrefillArgs,
    device: torch.device,
    lse: torch.Tensor | None,
) -> None:
    """Run the module with a filled argument struct on ``device``'s current stream (nothing
    to launch for a plan without work items); ``lse`` is zeroed for variants without
    softmax, whose kernels do not write it."""
    if meta[1] > 0:
        module.launch(args, raw_stream(device))
    if lse is not None and module.ir.normalize != "softmax":  # type: ignore[attr-defined]
        lse.zero_()


def pack_params(module: PrefillModule, values: Mapping[str, object]) -> ctypes.Structure:
    """The one packing of resolved param ``values`` into the module's ``Params`` struct."""
    check_param_memory(values, packed=True)
    return abi.fill_params(module.params_type, module.ir.params, values)  # type: ignore[attr-defined]


@torch.library.custom_op("attnc::prefill", mutates_args=())
def prefill_op(
    variant_handle: int,
    module_id: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    workspace: torch.Tensor,
    meta: list[int],
    sm_scale: float,
    int_params: list[int],
    float_params: list[float],
    tensor_params: list[torch.Tensor],
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional prefill through the module ``module_id``: returns (O, LSE); LSE is empty
    unless ``return_lse``. The param values' derived float32 values are checked here, where
    they are numbers again (a trace sees symbols), by the variant ``variant_handle`` while
    it lives and was compiled to the module's IR (an exported graph may outlive it, or be
    loaded in a process where the handle names another variant)."""
    module = module_by_id(module_id)
    values = join_params(module.ir.params, int_params, float_params, tensor_params)  # type: ignore[attr-defined]
    variant = live_variant(variant_handle)
    if variant is not None and _same_code(variant.ir, module.ir):  # type: ignore[arg-type]
        variant.check_derived_values(values, sm_scale, tuple(meta[_HEADS]))  # type: ignore[arg-type]
    o, lse = attention_outputs(q, return_lse, contiguous_o=True)
    params = pack_params(module, values)
    outputs = PrefillTensors(q, k, v, o, lse if return_lse else None, workspace)
    launch(module, meta, outputs, sm_scale, params)
    return o, lse


register_attention_fake(prefill_op, q_index=2, contiguous_o=True)


def _same_code(a: ir.VariantIR, b: ir.VariantIR) -> bool:
    """Whether variant IR ``a`` compiles to module IR ``b`` (a module found by its path may
    have been built for the same text read from another file, or with another doc)."""
    return a is b or a.same_code(b)


def launch_meta(
    host: HostPlan, heads: tuple[int, int, int], kv_code: int, page_status: int
) -> list[int]:
    """The ``META_FIELDS`` of a plan (``kv_code``: abi.KV_*; ``page_status``: the address of
    the page-status word of paged plans, else 0)."""
    r = host.result
    mapped = host.tile_map_offset >= 0
    return [
        r.batch,  # requests
        r.num_items,
        r.num_merge,
        host.tile_q_tokens,
        host.page_size,
        kv_code,
        *heads,
        r.off_qo_indptr,
        r.off_kv_indptr,
        r.off_kv_indices,  # -1: ragged
        r.off_kv_last_page_len,
        r.off_items,
        r.off_merge_items,
        host.part_o_offset,
        host.part_lse_offset,
        page_status,
        r.off_kv_token_start,
        host.tile_map_offset,
        r.off_tile_map_start if mapped else -1,
        abi.TILE_MAP_KV_BLOCK,
    ]
