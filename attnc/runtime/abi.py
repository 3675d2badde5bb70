"""ctypes mirrors of the module C ABIs: the prefill arguments (``attnc/prefill_args.h``), the
decode arguments (``attnc/decode_args.h``), the launcher error codes and a variant's ``Params``
struct, plus the function signatures a loaded prefill module exports."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from attnc.codegen.params_layout import ctypes_fields, params_layout
from attnc.compiler.ir import ParamDecl

PREFILL_ABI_VERSION = 4
DECODE_ABI_VERSION = 3
# AttncDecodeArgs.flags bits
FLAG_MERGE = 1

KV_RAGGED, KV_PAGED_NHD, KV_PAGED_HND = 0, 1, 2
# AttncPrefillArgs.tile_map byte values (attnc/prefill_args.h AttncTileMapClass)
TILE_EMPTY, TILE_FULL, TILE_PARTIAL = 0, 1, 2
# Keys per tile-map column the kernels expect (AttncPrefillArgs.tile_map_kv_block)
TILE_MAP_KV_BLOCK = 64

# The one mirror of attnc/abi_codes.h (tests/codegen/test_abi_codes.py compares them).
# Launcher return codes beyond cudaError_t values.
ERROR_NAMES = {
    10001: "ATTNC_E_BAD_PARAMS_SIZE",
    10002: "ATTNC_E_BAD_HEAD_DIM",
    10003: "ATTNC_E_BAD_LAYOUT",
    10004: "ATTNC_E_BAD_TILE",
}
# Return codes of the host planners.
PLAN_OK, PLAN_OUT_OF_RANGE, PLAN_CAPACITY, PLAN_INVALID, PLAN_CUDA = 0, 1, 2, 3, 4
PLAN_NO_MEMORY = 5  # the planner's host scratch could not be allocated (host/c_boundary.h)
# The page-table or index-list check that failed (the planner result's error after
# PLAN_INVALID); from 10 on, the prefill planner's only.
PT_INDPTR_EMPTY = 1
PT_INDPTR_START = 2
PT_INDPTR_DECREASING = 3
PT_LAST_COUNT = 4
PT_LAST_RANGE = 5
PT_BATCH_CAPACITY = 6
PT_PAGE_CAPACITY = 7
PT_INDICES_SHORT = 8
PT_INDEX_NEGATIVE = 9
PT_QO_INDPTR_EMPTY = 10
PT_QO_INDPTR_START = 11
PT_QO_INDPTR_DECREASING = 12
PT_INDPTR_COUNT = 13
PT_QUERY_TOKENS = 14
PT_KV_TOKENS = 15


def raise_if_no_memory(rc: int, planner: str) -> None:
    """The ``MemoryError`` of a host planner call that returned ``PLAN_NO_MEMORY`` (``planner``
    names it); nothing for any other code."""
    if rc == PLAN_NO_MEMORY:
        raise MemoryError(f"attnc: {planner}: the host planner could not allocate its scratch")


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32

# Field groups both argument structs hold, in this order (each struct's own fields sit between).
_QKV_OUT_FIELDS: list[tuple[str, Any]] = [
    ("q", _P),
    ("k", _P),
    ("v", _P),
    ("o", _P),
    ("lse", _P),
]
_SPLIT_KV_AND_STRIDE_FIELDS: list[tuple[str, Any]] = [
    ("merge_items", _P),
    ("part_o", _P),
    ("part_lse", _P),
    ("q_stride_tok", _I64),
    ("q_stride_head", _I64),
    ("o_stride_tok", _I64),
    ("o_stride_head", _I64),
    ("kv_stride_page", _I64),
    ("kv_stride_tok", _I64),
    ("kv_stride_head", _I64),
]
_HEAD_AND_KV_SHAPE_FIELDS: list[tuple[str, Any]] = [
    ("num_qo_heads", _I32),
    ("num_kv_heads", _I32),
    ("head_dim", _I32),
    ("page_size", _I32),
    ("kv_layout", _I32),
]
_SCALE_PARAMS_AND_PAGE_CHECK_FIELDS: list[tuple[str, Any]] = [
    ("sm_scale", ctypes.c_float),
    ("variant_params", _P),
    ("variant_params_size", _I64),
    ("page_status", _P),
    ("num_pages", _I32),
]


class AttncPrefillArgs(ctypes.Structure):
    """Field-for-field mirror of ``struct AttncPrefillArgs``; pointers are plain addresses."""

    _fields_ = [
        *_QKV_OUT_FIELDS,
        ("qo_indptr", _P),
        ("kv_indptr", _P),
        ("kv_indices", _P),
        ("kv_last_page_len", _P),
        ("items", _P),
        *_SPLIT_KV_AND_STRIDE_FIELDS,
        ("batch_size", _I32),
        ("num_work", _I32),
        ("num_merge", _I32),
        *_HEAD_AND_KV_SHAPE_FIELDS,
        ("tile_q_tokens", _I32),
        *_SCALE_PARAMS_AND_PAGE_CHECK_FIELDS,
        ("kv_token_start", _P),
        ("tile_map", _P),
        ("tile_map_start", _P),
        ("tile_map_kv_block", _I32),
    ]


def paged_kv_code(kv_layout: str) -> int:
    """The kernels' code of a paged KV cache laid out as ``kv_layout`` (``"NHD"``, else HND)."""
    return KV_PAGED_NHD if kv_layout == "NHD" else KV_PAGED_HND


def error_name(code: int) -> str:
    """A readable name for a launcher return code."""
    return ERROR_NAMES.get(code, f"cudaError_t {code}")


def declare_prefill_functions(lib: ctypes.CDLL) -> None:
    """Set argument and return types of the functions a prefill module exports."""
    lib.attnc_prefill.argtypes = [ctypes.POINTER(AttncPrefillArgs), ctypes.c_void_p]
    lib.attnc_prefill.restype = ctypes.c_int
    lib.attnc_prefill_abi_version.argtypes = []
    lib.attnc_prefill_abi_version.restype = ctypes.c_int
    lib.attnc_prefill_tile_q_tokens.argtypes = [_I32, _I32, _I32]
    lib.attnc_prefill_tile_q_tokens.restype = ctypes.c_int
    lib.attnc_prefill_ctas_per_sm.argtypes = [_I32, _I32, _I32]
    lib.attnc_prefill_ctas_per_sm.restype = ctypes.c_int


def params_struct(decls: Sequence[ParamDecl]) -> type[ctypes.Structure]:
    """A ctypes Structure laid out like the generated C++ ``Params`` struct: both are made
    from the one layout description in ``attnc.codegen.params_layout`` (field order, types,
    mangled names, the ``unused_`` member of a variant without params)."""
    return type("VariantParams", (ctypes.Structure,), {"_fields_": ctypes_fields(decls)})


def fill_params(
    struct_type: type[ctypes.Structure],
    decls: Sequence[ParamDecl],
    values: Mapping[str, object],
) -> ctypes.Structure:
    """An instance of ``struct_type`` holding resolved param ``values`` (see ``resolve_params``).

    The caller must keep the tensors alive while the kernel may read them.
    """
    struct = struct_type()
    for decl, field in zip(decls, params_layout(decls), strict=False):
        value = values[decl.name]
        if decl.kind == "tensor":
            assert isinstance(value, torch.Tensor)
            setattr(struct, field.c_name, value.data_ptr())
        elif decl.dtype == "bool":
            setattr(struct, field.c_name, 1 if value else 0)
        else:
            setattr(struct, field.c_name, value)
    return struct


class AttncDecodeArgs(ctypes.Structure):
    """Field-for-field mirror of ``struct AttncDecodeArgs``; pointers are plain addresses."""

    _fields_ = [
        *_QKV_OUT_FIELDS,
        ("header", _P),
        ("cta_indptr", _P),
        ("items", _P),
        ("req_page_begin", _P),
        ("req_kv_len", _P),
        ("page_ids", _P),
        *_SPLIT_KV_AND_STRIDE_FIELDS,
        *_HEAD_AND_KV_SHAPE_FIELDS,
        ("rows_per_item", _I32),
        ("num_ctas", _I32),
        ("merge_ctas", _I32),
        ("flags", _I32),
        *_SCALE_PARAMS_AND_PAGE_CHECK_FIELDS,
        ("kv_token_start", _P),
    ]
