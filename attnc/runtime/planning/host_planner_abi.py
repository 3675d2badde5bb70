"""Owns: what the two host planner libraries (decode: ``decode_plan_library.py``, prefill:
``prefill_plan_library.py``) share on the Python side: where their C++ lives and how it is
built (``HOST_DIR``, ``ARCH``, ``BUILD_FLAGS``: host-only nvcc, ``-ffp-contract=off`` so
float costs match the numpy oracles of the tests bit for bit), and the mirror of the mask's
range rows both read (``attnc/kernels/host/mask_range_rows.h``): the ``ATTNC_PR_*`` columns
of a row and ``AttncRangeRows``, which the prefill parameters and the decode step parameters
embed (their ``sizeof`` checks at load cover it). The rows themselves are built by
``mask_ranges.tile_range_program``."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnc.runtime.build.host_library import (
    OnceLibrary,
    PlannerUnavailable,
    host_source,
    load_host_library,
)
from attnc.version import PACKAGE_DIR

if TYPE_CHECKING:
    from attnc.runtime.planning.mask_ranges import RangeProgram

HOST_DIR = PACKAGE_DIR / "kernels" / "host"
ARCH = "80"  # host-only code: any arch nvcc accepts; part of the cache key only
BUILD_FLAGS = ("-Xcompiler", "-ffp-contract=off", f"-I{HOST_DIR}")


def planner_source(name: str) -> str:
    """The text the JIT compiles for planner ``name``: ``attnc/kernels/host/{name}.cpp`` under
    a digest of the host headers (so any header change rebuilds it)."""
    return host_source(HOST_DIR, f"{name}.cpp")


def planner_loader(
    name: str,
    signatures: Mapping[str, tuple[Any, Any]],
    structs: Sequence[type[ctypes.Structure]],
) -> Callable[[], ctypes.CDLL]:
    """Build (or find in the cache) and load planner ``name`` (``{name}.cpp``), its
    ``attnc_{name}_sizes`` checked against ``structs``."""

    def load() -> ctypes.CDLL:
        source = planner_source(name)
        sizes = f"attnc_{name}_sizes"
        return load_host_library(name, source, ARCH, BUILD_FLAGS, signatures, structs, sizes)

    return load


def planner_unavailable(name: str, wrapper: str) -> Callable[[str], PlannerUnavailable]:
    """The error of planner ``name`` failing to build or load for ``reason``: ``wrapper``'s
    ``plan()`` cannot run."""

    def unavailable(reason: str) -> PlannerUnavailable:
        return PlannerUnavailable(
            f"attnc: the {name.split('_')[0]} planner library (attnc/kernels/host/{name}.cpp) "
            f"could not be built or loaded, so {wrapper}.plan() cannot run:\n{reason}"
        )

    return unavailable


def planner_library(
    name: str,
    wrapper: str,
    signatures: Mapping[str, tuple[Any, Any]],
    structs: Sequence[type[ctypes.Structure]],
) -> tuple[Callable[[], str], Callable[[], ctypes.CDLL], OnceLibrary]:
    """Planner ``name``'s source (``planner_source``), its loader (``planner_loader``) and
    its load-once state, whose failure says that ``wrapper.plan()`` cannot run."""
    load = planner_loader(name, signatures, structs)
    once = OnceLibrary(load, planner_unavailable(name, wrapper))
    return functools.partial(planner_source, name), load, once


# Columns of one row (ATTNC_PR_*): the constraint cq*q_idx + ck*kv_idx + c >= 0 of
# conjunction ``term`` (-1: a wrap guard), c = c0 + q_len*q_len + kv_len*kv_len (+ the
# request's entry of extra column ``extra`` when >= 0).
PR_TERM, PR_CQ, PR_CK, PR_C0, PR_Q_LEN, PR_KV_LEN, PR_EXTRA = range(7)
PR_COLUMNS = 7

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class RangeRows(ctypes.Structure):
    """Mirror of ``AttncRangeRows``."""

    _fields_ = [
        ("rows", _P), ("num_rows", _I64), ("num_terms", _I64),
        ("extra", _P), ("num_extra", _I64), ("extra_batch", _I64),
    ]  # fmt: skip

    def set(
        self, program: RangeProgram | None, extra: np.ndarray | None = None
    ) -> tuple[object, ...]:
        """Point at ``program``'s rows and the int64 ``[columns, batch]`` ``extra`` values
        (``program.extra``), or at no rows (None: no closed form). Returns what the caller
        keeps alive while the planner may read it."""
        if program is None:
            self.rows, self.num_rows, self.num_terms = None, 0, 0
            self.extra, self.num_extra, self.extra_batch = None, 0, 0
            return ()
        self.rows, self.num_rows = program.rows_ptr, program.rows.shape[0]
        self.num_terms = program.num_terms
        if extra is None:
            self.extra, self.num_extra, self.extra_batch = None, 0, 0
            return (program,)
        extra = np.ascontiguousarray(extra, dtype=np.int64)
        self.extra, self.num_extra, self.extra_batch = extra.ctypes.data, *extra.shape
        return (program, extra)
