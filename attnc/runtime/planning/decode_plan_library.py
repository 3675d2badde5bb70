"""Owns: the host decode planner library (``attnc/kernels/host/decode_plan.cpp``) as Python
sees it: its source for the JIT cache, its C function signatures and the ctypes mirrors of
``decode_plan_abi.h``'s structs, checked against the library's ``sizeof`` on load. How it is
built is shared with the prefill planner (``host_planner_abi.py``). A lasting build or load
failure (no nvcc, a compile error) is remembered and raised as ``PlannerUnavailable`` on every
call (no second build, no fallback); a passing one (a build lock held past the timeout, an
interrupted build) is raised once, and the next call tries again (``host_library.passing``)."""

from __future__ import annotations

import ctypes

import numpy as np

from attnc.runtime.planning import host_planner_abi as host
from attnc.runtime.planning.host_planner_abi import RangeRows

ARCH, BUILD_FLAGS, HOST_DIR = host.ARCH, host.BUILD_FLAGS, host.HOST_DIR  # shared by the planners
PlannerUnavailable = host.PlannerUnavailable  # what library() raises

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
        ("indptr_checked", _I64),
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
        ("tables_checked", _I64),
        ("dev_work", _P),
        ("dev_page_ids", _P),
        ("page_stage", _P),
        ("page_stage_bytes", _I64),
        ("stream", _P),
        ("device", _I64),
        ("event", _P),
        ("ranges", RangeRows),
        ("span_offset", _P),
        ("span_len", _P),
        ("dev_token_start", _P),
        ("token_stage", _P),
    ]


class StepResult(ctypes.Structure):
    """Mirror of ``AttncStepResult``."""

    _fields_ = [
        *((name, _I64) for name in (
            "error", "index", "value", "value2", "batch", "nnz", "max_page", "cuda_error",
        )),
        ("summary", PlanSummary),
        ("total_kv", _I64),
    ]  # fmt: skip


STRUCTS = (PlanParams, PlanSummary, StepParams, StepResult)  # attnc_decode_plan_sizes order


_STEP_P, _RESULT_P = ctypes.POINTER(StepParams), ctypes.POINTER(StepResult)
_SIGNATURES = {
    "attnc_decode_plan": ([ctypes.POINTER(PlanParams), ctypes.POINTER(PlanSummary)], ctypes.c_int),
    "attnc_decode_plan_sizes": ([ctypes.c_void_p], None),
    "attnc_decode_check": ([_STEP_P, _RESULT_P], ctypes.c_int),
    "attnc_decode_step": ([_STEP_P, _RESULT_P], ctypes.c_int),
    "attnc_decode_step_checked": ([_STEP_P, _RESULT_P], ctypes.c_int),
    "attnc_decode_spans": (
        [ctypes.POINTER(RangeRows), _P, _I64, _I64, _I64, _P, _P],
        ctypes.c_int,
    ),
    "attnc_decode_wait": ([_STEP_P], ctypes.c_int),
    "attnc_decode_release": ([_STEP_P], ctypes.c_int),
    "attnc_decode_cuda_error": ([ctypes.c_int], ctypes.c_char_p),
    "attnc_decode_fake_cuda": ([ctypes.c_int, ctypes.c_void_p], None),
}


# The source the JIT compiles, its loader, and the library or why it could not be had.
source, _load, ONCE = host.planner_library(
    "decode_plan", "BatchDecodeWrapper", _SIGNATURES, STRUCTS
)


def library() -> ctypes.CDLL:
    """The loaded planner library, built on first use; raises ``PlannerUnavailable``."""
    return ONCE.get()


def fake_cuda(fake: int) -> list[int]:
    """Test only: ``fake`` 1 replaces the step's CUDA calls by host memcpys, 0 restores them,
    -1 leaves them; returns the copies, event records, waits and event creations so far."""
    out = np.zeros(4, np.int64)
    library().attnc_decode_fake_cuda(fake, out.ctypes.data)
    return [int(v) for v in out]
