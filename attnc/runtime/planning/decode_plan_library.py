"""Owns: the ctypes mirrors of the host decode planner's structs
(``attnc/kernels/host/decode_plan_abi.h``), field for field; their sizes are compared with the
library's ``sizeof`` when it is loaded (``decode_plan.py``)."""

from __future__ import annotations

import ctypes

MAX_SPLIT_FACTORS = 4  # ATTNC_PLAN_MAX_SPLIT_FACTORS
_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class PlanParams(ctypes.Structure):
    """Mirror of ``AttncPlanParams``."""

    _fields_ = [
        *((name, _I64) for name in (
            "batch", "q_len", "num_qo_heads", "num_kv_heads", "row_blocks", "num_ctas",
            "kv_tile", "max_part_rows", "min_chunk", "max_items",
        )),
        ("alpha", ctypes.c_double),
        ("beta", ctypes.c_double),
        ("kv_lens", _P),
        ("req_page_begin", _P),
        ("buf", _P),
        *((name, _I64) for name in (
            "buf_bytes", "off_header", "off_cta_indptr", "off_req_page_begin", "off_req_kv_len",
            "off_merge_items", "off_items",
        )),
        ("out_items", _P),
        ("out_cost", _P),
        ("out_items_cap", _I64),
        ("out_cta_indptr", _P),
        ("out_merge_items", _P),
        ("out_num_chunks", _P),
        ("plan_lens", _P),
        ("kv_offset", _P),
        ("visible_count", _I64),
        ("split_factors", _I64 * MAX_SPLIT_FACTORS),
        ("num_split_factors", _I64),
    ]  # fmt: skip


class PlanSummary(ctypes.Structure):
    """Mirror of ``AttncPlanSummary``."""

    _fields_ = [
        (name, _I64)
        for name in (
            "num_items", "num_split", "merge_rows", "chunk_size", "num_part_slots",
            "total_chunks", "work_bytes",
        )
    ]  # fmt: skip


class StepParams(ctypes.Structure):
    """Mirror of ``AttncStepParams``."""

    _fields_ = [
        ("plan", PlanParams),
        ("kv_indptr", _P),
        ("indptr_len", _I64),
        ("last_page_len", _P),
        ("last_len", _I64),
        ("page_size", _I64),
        ("max_batch", _I64),
        ("max_pages", _I64),
        ("kv_out", _P),
        ("page_begin_out", _P),
        ("kv_indices", _P),
        ("indices_len", _I64),
        ("indices_on_device", _I64),
        ("dev_work", _P),
        ("dev_page_ids", _P),
        ("page_stage", _P),
        ("page_stage_bytes", _I64),
        ("stream", _P),
        ("device", _I64),
        ("event", _P),
    ]


class StepResult(ctypes.Structure):
    """Mirror of ``AttncStepResult``."""

    _fields_ = [
        *((name, _I64) for name in (
            "error", "index", "value", "value2", "batch", "nnz", "max_page", "cuda_error",
        )),
        ("summary", PlanSummary),
    ]  # fmt: skip


STRUCTS = (PlanParams, PlanSummary, StepParams, StepResult)  # attnc_decode_plan_sizes order
