"""Owns: the prefill planner's library, ``attnc/kernels/host/prefill_plan.cpp``, on the Python
side: the text the JIT compiles, the entry points' ctypes signatures, and field-for-field
mirrors of ``prefill_plan_abi.h`` whose sizes must equal the library's own ``sizeof``. The
build flags and the mask's range rows are those of ``host_planner_abi.py``. A lasting build or
load failure is kept and raised as ``PlannerUnavailable`` by every later call; a passing one
once, the next call trying again (``host_library.passing``)."""

from __future__ import annotations

import ctypes
import threading

from attnc.runtime.planning import host_planner_abi as host
from attnc.runtime.planning.host_planner_abi import RangeRows

ARCH, BUILD_FLAGS, HOST_DIR = host.ARCH, host.BUILD_FLAGS, host.HOST_DIR  # shared by the planners
PlannerUnavailable = host.PlannerUnavailable  # what library() raises

# AttncPrefillResult.error after PLAN_CAPACITY (prefill_plan_abi.h).
PP_OUT_BUFFER, PP_WORKSPACE, PP_COST_BUFFER, PP_COPY_BUFFER = 1, 2, 3, 4

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class PrefillParams(ctypes.Structure):
    """Mirror of ``AttncPrefillParams``."""

    _fields_ = [
        ("batch", _I64), ("qo_indptr", _P), ("qo_len", _I64),
        ("kv_indptr", _P), ("kv_len", _I64),
        ("kv_indices", _P), ("num_indices", _I64),
        ("kv_last_page_len", _P), ("num_last", _I64),
        ("page_size", _I64),
        ("q_lens", _P), ("kv_lens", _P), ("lens_cap", _I64),
        ("copy", _P), ("copy_cap", _I64),
        *((name, _I64) for name in (
            "num_qo_heads", "num_kv_heads", "head_dim", "tile_q_tokens", "num_ctas", "kv_align",
            "workspace_bytes", "map_reserve", "min_chunk", "max_chunks", "walk_ctas",
        )),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("ranges", RangeRows),
        ("tile_map", _P), ("tile_map_len", _I64), ("kv_block", _I64),
        ("out", _P), ("out_bytes", _I64),
        ("out_cost", _P), ("out_cost_cap", _I64),
    ]  # fmt: skip


class PrefillResult(ctypes.Structure):
    """Mirror of ``AttncPrefillResult``."""

    _fields_ = [
        (name, _I64)
        for name in (
            "error", "index", "value", "value2", "needed_bytes", "total_q", "total_kv", "max_q",
            "max_page", "nnz",
            "num_items", "num_merge", "num_chunks", "part_rows", "chunk_size", "total_bytes",
            "off_qo_indptr", "off_kv_indptr", "off_kv_token_start", "off_tile_map_start",
            "off_kv_indices", "off_kv_last_page_len", "off_items", "off_merge_items",
            "batch", "num_indices", "num_last",
        )
    ]  # fmt: skip


STRUCTS = (PrefillParams, PrefillResult)  # attnc_prefill_plan_sizes order


_PARAMS_P, _RESULT_P = ctypes.POINTER(PrefillParams), ctypes.POINTER(PrefillResult)
_SIGNATURES = {
    "attnc_prefill_check": ([_PARAMS_P, _RESULT_P], ctypes.c_int),
    "attnc_prefill_plan": ([_PARAMS_P, _RESULT_P], ctypes.c_int),
    "attnc_prefill_plan_sizes": ([ctypes.c_void_p], None),
    "attnc_prefill_map_starts": ([_PARAMS_P, _I64, _I64, ctypes.c_void_p], None),
    "attnc_prefill_map_summary": ([_PARAMS_P, _P, _I64, _I64, _P, _P, _P, _P], ctypes.c_int),
}


# The source the JIT compiles, its loader, and the library or why it could not be had.
source, _load, ONCE = host.planner_library(
    "prefill_plan", "BatchPrefillWrapper", _SIGNATURES, STRUCTS
)


def library() -> ctypes.CDLL:
    """The loaded planner library, built on first use; raises ``PlannerUnavailable``."""
    return ONCE.get()


def build_in_background() -> threading.Thread:
    """Start building (or loading) the library on a thread and return it, so that the caller
    can build a kernel module meanwhile (two nvcc processes side by side). ``library()``
    waits for that build and raises its failure (a passing one once, without a second
    build in the same call)."""
    return ONCE.load_in_background("attnc-prefill-planner-build")


def loaded() -> bool:
    """True when the library is loaded already (or failed: nothing is left to build)."""
    return ONCE.settled
