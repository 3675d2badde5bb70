"""Owns: the host decode planner library as Python sees it: building it from
``attnc/kernels/host/decode_plan.cpp`` through the JIT cache (nvcc on host-only C++,
``-ffp-contract=off`` so float costs match the oracle of the tests bit for bit), loading it
with its function signatures, and the ctypes mirrors of its structs
(``decode_plan_abi.h``), field for field, whose sizes are compared with the library's
``sizeof`` on load. A build or load failure is remembered and raised as
``PlannerUnavailable`` on every call (no second build attempt, no fallback)."""

from __future__ import annotations

import ctypes

import numpy as np

from attnc.runtime.build.host_library import (
    OnceLibrary,
    PlannerUnavailable,
    host_source,
    load_host_library,
)
from attnc.runtime.planning.range_rows_abi import RangeRows
from attnc.version import PACKAGE_DIR

HOST_DIR = PACKAGE_DIR / "kernels" / "host"
ARCH = "80"  # host-only code: any arch nvcc accepts; part of the cache key only
BUILD_FLAGS = ("-Xcompiler", "-ffp-contract=off", f"-I{HOST_DIR}")

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
    "attnc_decode_spans": (
        [ctypes.POINTER(RangeRows), _P, _I64, _I64, _I64, _P, _P],
        ctypes.c_int,
    ),
    "attnc_decode_wait": ([_STEP_P], ctypes.c_int),
    "attnc_decode_release": ([_STEP_P], ctypes.c_int),
    "attnc_decode_cuda_error": ([ctypes.c_int], ctypes.c_char_p),
    "attnc_decode_fake_cuda": ([ctypes.c_int, ctypes.c_void_p], None),
}


def source() -> str:
    """The text the JIT compiles: ``decode_plan.cpp`` under a digest of the host headers
    (so any header change rebuilds it)."""
    return host_source(HOST_DIR, "decode_plan.cpp")


def library() -> ctypes.CDLL:
    """The loaded planner library, built on first use; raises ``PlannerUnavailable``."""
    return ONCE.get()


def _load() -> ctypes.CDLL:
    return load_host_library(
        "decode_plan", source(), ARCH, BUILD_FLAGS, _SIGNATURES, STRUCTS, "attnc_decode_plan_sizes"
    )


def _unavailable(reason: str) -> PlannerUnavailable:
    return PlannerUnavailable(
        f"attnc: the decode planner library (attnc/kernels/host/decode_plan.cpp) could "
        f"not be built or loaded, so BatchDecodeWrapper.plan() cannot run:\n{reason}"
    )


ONCE = OnceLibrary(_load, _unavailable)  # the library, or why it could not be had


def fake_cuda(fake: int) -> list[int]:
    """Test only: ``fake`` 1 replaces the step's CUDA calls by host memcpys, 0 restores them,
    -1 leaves them; returns the copies, event records, waits and event creations so far."""
    out = np.zeros(4, np.int64)
    library().attnc_decode_fake_cuda(fake, out.ctypes.data)
    return [int(v) for v in out]
