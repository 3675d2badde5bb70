"""Owns: the host prefill planner library as Python sees it: building it from
``attnc/kernels/host/prefill_plan.cpp`` through the JIT cache (nvcc on host-only C++,
``-ffp-contract=off`` so float costs match the numpy oracle of the tests bit for bit), loading
it with its function signatures, and the ctypes mirrors of its structs
(``prefill_plan_abi.h``), field for field, whose sizes are compared with the library's
``sizeof`` on load. A build or load failure is remembered and raised as
``PlannerUnavailable`` on every call (no second build attempt, no fallback)."""

from __future__ import annotations

import ctypes

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

# AttncPrefillResult.error after PLAN_CAPACITY (prefill_plan_abi.h).
PP_OUT_BUFFER, PP_WORKSPACE, PP_COST_BUFFER = 1, 2, 3

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class PrefillParams(ctypes.Structure):
    """Mirror of ``AttncPrefillParams``."""

    _fields_ = [
        ("batch", _I64),
        ("qo_indptr", _P), ("qo_len", _I64),
        ("kv_indptr", _P), ("kv_len", _I64),
        ("kv_indices", _P), ("num_indices", _I64),
        ("kv_last_page_len", _P), ("num_last", _I64),
        ("page_size", _I64),
        ("q_lens", _P), ("kv_lens", _P), ("lens_cap", _I64),
        *((name, _I64) for name in (
            "num_qo_heads", "num_kv_heads", "head_dim", "tile_q_tokens", "num_ctas", "kv_align",
            "workspace_bytes", "map_reserve", "min_chunk", "max_chunks",
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
            "error", "needed_bytes", "total_q", "total_kv", "max_q", "max_page", "nnz",
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
}


def source() -> str:
    """The text the JIT compiles: ``prefill_plan.cpp`` under a digest of the host headers
    (so any header change rebuilds it)."""
    return host_source(HOST_DIR, "prefill_plan.cpp")


def library() -> ctypes.CDLL:
    """The loaded planner library, built on first use; raises ``PlannerUnavailable``."""
    return ONCE.get()


def _load() -> ctypes.CDLL:
    return load_host_library(
        "prefill_plan",
        source(),
        ARCH,
        BUILD_FLAGS,
        _SIGNATURES,
        STRUCTS,
        "attnc_prefill_plan_sizes",
    )


def _unavailable(reason: str) -> PlannerUnavailable:
    return PlannerUnavailable(
        "attnc: the prefill planner library (attnc/kernels/host/prefill_plan.cpp) "
        f"could not be built or loaded, so BatchPrefillWrapper.plan() cannot run:\n{reason}"
    )


ONCE = OnceLibrary(_load, _unavailable)  # the library, or why it could not be had
