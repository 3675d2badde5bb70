"""Owns: the Python binding of the host prefill planner, the C++ library built from
``attnc/kernels/host/prefill_plan*`` (``prefill_plan_library.py``) and called through ctypes.

A ``PrefillPlanner`` is made once per wrapper and keeps its buffers between plans: the
per-request lengths, the byte buffer the packed lists are written into (pinned when the
lists are copied to a CUDA workspace, grown when a batch needs more) and the chunk costs.
``check`` validates the int32 batch description and derives each request's lengths; ``plan``
then writes the whole work list (tile KV ranges from the mask's closed form and the tile map,
split-KV chunks, the heaviest-first order, the merge list) in one C call. A failed check is
reported as ``False``: the caller raises the Python checks' own message.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from attnc.runtime import abi
from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.planning.prefill_plan_library import (
    PP_COST_BUFFER,
    PP_OUT_BUFFER,
    PP_WORKSPACE,
    PrefillParams,
    PrefillResult,
    library,
)
from attnc.runtime.planning.workspace import ALIGN, Int32Regions

ALPHA = 1.0  # cost of one query token of a tile, in KV tokens
BETA = 1.0  # cost of one KV token
MIN_CHUNK = 512  # never cut a tile's KV range into chunks shorter than this
MAX_CHUNKS = 64  # chunks per tile at most
KV_ALIGN = 128  # chunk sizes are multiples of this
ITEM_INTS = 8  # prefill_args.h: ATTNC_PI_SIZE
MERGE_INTS = 4  # prefill_args.h: ATTNC_PM_SIZE
OUT_OF_RANGE_MESSAGE = (
    "prefill plan: the batch is beyond the planner's limits (positive head counts, tile and "
    "chunk sizes below 2^30, a tile map at least as long as the batch needs); nothing was "
    "planned"
)


@dataclass(frozen=True)
class PlannerShape:
    """The scalars of one plan besides the batch."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    tile_q_tokens: int
    num_ctas: int
    workspace_bytes: int
    map_reserve: int = 0
    kv_align: int = KV_ALIGN
    kv_block: int = 64


@dataclass(frozen=True)
class PlannedLists:
    """What one ``plan`` wrote: the packed lists (``buffer``, a view of the planner's buffer,
    valid until its next plan) and their counts and offsets."""

    buffer: np.ndarray  # uint8 [layout.total_bytes]
    layout: Int32Regions
    num_items: int
    num_merge: int
    part_rows: int
    chunk_size: int
    chunk_cost: np.ndarray  # float64 [num_items / num_kv_heads], in work-list order


class PrefillPlanner:
    """The host prefill planner with its reused buffers (``pinned``: page-locked output)."""

    def __init__(self, pinned: bool = False) -> None:
        self._lib = library()
        self._pinned = pinned
        self._p, self._r = PrefillParams(), PrefillResult()
        self._p_ref, self._r_ref = ctypes.byref(self._p), ctypes.byref(self._r)
        p = self._p
        p.alpha, p.beta, p.min_chunk, p.max_chunks = ALPHA, BETA, MIN_CHUNK, MAX_CHUNKS
        self._lens = np.zeros((2, 0), np.int64)
        self._cost = np.zeros(0, np.float64)
        self.out_tensor = torch.zeros(0, dtype=torch.uint8)
        self._out = self.out_tensor.numpy()
        self.batch = 0

    @property
    def result(self) -> PrefillResult:
        """The last call's result struct (totals after ``check``, counts after ``plan``)."""
        return self._r

    @property
    def page_size(self) -> int:
        """Tokens per page of the last ``check`` (1 for ragged KV)."""
        return int(self._p.page_size)

    @property
    def q_lens(self) -> np.ndarray:
        """int64 [batch]: query tokens per request of the last ``check`` (a reused buffer)."""
        return self._lens[0, : self.batch]

    @property
    def kv_lens(self) -> np.ndarray:
        """int64 [batch]: KV tokens per request of the last ``check`` (a reused buffer)."""
        return self._lens[1, : self.batch]

    def check(
        self,
        qo_indptr: np.ndarray,
        kv_indptr: np.ndarray,
        kv_indices: np.ndarray | None,
        kv_last_page_len: np.ndarray | None,
        page_size: int,
    ) -> bool:
        """Validate contiguous int32 arrays (page ids and last-page lengths for paged KV) and
        derive the lengths; False when a check fails (nothing else is changed then)."""
        p = self._p
        p.qo_indptr, p.qo_len = qo_indptr.ctypes.data, qo_indptr.shape[0]
        p.kv_indptr, p.kv_len = kv_indptr.ctypes.data, kv_indptr.shape[0]
        if kv_indices is None or kv_last_page_len is None:
            p.kv_indices = p.kv_last_page_len = None
            p.num_indices = p.num_last = 0
        else:
            p.kv_indices, p.num_indices = kv_indices.ctypes.data, kv_indices.shape[0]
            p.kv_last_page_len = kv_last_page_len.ctypes.data
            p.num_last = kv_last_page_len.shape[0]
        p.page_size = page_size
        if self._lens.shape[1] < qo_indptr.shape[0]:
            self._lens = np.zeros((2, 2 * qo_indptr.shape[0]), np.int64)
        p.q_lens, p.kv_lens = self._lens[0].ctypes.data, self._lens[1].ctypes.data
        p.lens_cap = self._lens.shape[1]
        rc = self._lib.attnc_prefill_check(self._p_ref, self._r_ref)
        if rc == abi.PLAN_INVALID:
            return False
        if rc != abi.PLAN_OK:
            raise RuntimeError(f"attnc: prefill plan: check returned {rc}")
        self.batch = int(p.batch)
        if p.kv_indices is not None:
            p.num_indices = self._r.nnz  # the plan packs the used page ids only
        return True

    def plan(
        self,
        shape: PlannerShape,
        program: RangeProgram | None = None,
        tile_map: np.ndarray | None = None,
    ) -> PlannedLists:
        """The work list of the last checked batch (``tile_map``: uint8 host classes)."""
        p = self._p
        p.num_qo_heads, p.num_kv_heads, p.head_dim = (
            shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
        )  # fmt: skip
        p.tile_q_tokens, p.num_ctas, p.kv_align = (
            shape.tile_q_tokens,
            shape.num_ctas,
            shape.kv_align,
        )
        p.workspace_bytes, p.map_reserve = shape.workspace_bytes, shape.map_reserve
        extra = None
        if program is None:
            p.range_rows, p.num_range_rows, p.num_terms = None, 0, 0
            p.range_extra, p.num_extra = None, 0
        else:
            rows = program.rows
            p.range_rows, p.num_range_rows = rows.ctypes.data, rows.shape[0]
            p.num_terms = program.num_terms
            extra = program.extra(self.q_lens, self.kv_lens)
            if extra is None:
                p.range_extra, p.num_extra = None, 0
            else:
                extra = np.ascontiguousarray(extra, dtype=np.int64)
                p.range_extra, p.num_extra = extra.ctypes.data, extra.shape[0]
        if tile_map is None:
            p.tile_map, p.tile_map_len = None, 0
        else:
            p.tile_map, p.tile_map_len = tile_map.ctypes.data, tile_map.shape[0]
        p.kv_block = shape.kv_block
        return self._run(extra)

    def _run(self, keep_alive: object) -> PlannedLists:
        p, r = self._p, self._r
        while True:
            p.out, p.out_bytes = self._out.ctypes.data, self._out.shape[0]
            p.out_cost, p.out_cost_cap = self._cost.ctypes.data, self._cost.shape[0]
            rc = self._lib.attnc_prefill_plan(self._p_ref, self._r_ref)
            if rc == abi.PLAN_CAPACITY and r.error == PP_OUT_BUFFER:
                self._grow(int(r.needed_bytes))
            elif rc == abi.PLAN_CAPACITY and r.error == PP_COST_BUFFER:
                self._cost = np.zeros(2 * int(r.needed_bytes), np.float64)
            else:
                break
        del keep_alive
        if rc == abi.PLAN_CAPACITY and r.error == PP_WORKSPACE:
            raise ValueError(
                f"workspace_buffer: has {p.workspace_bytes} bytes, the work lists need "
                f"{r.needed_bytes}"
            )
        if rc == abi.PLAN_OUT_OF_RANGE:
            raise ValueError(OUT_OF_RANGE_MESSAGE)
        if rc != abi.PLAN_OK:
            raise RuntimeError(f"attnc: prefill plan: the planner returned {rc}")
        return PlannedLists(
            buffer=self._out[: r.total_bytes],
            layout=_regions(r, p),
            num_items=int(r.num_items),
            num_merge=int(r.num_merge),
            part_rows=int(r.part_rows),
            chunk_size=int(r.chunk_size),
            chunk_cost=self._cost[: r.num_chunks],
        )

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._out.shape[0], 64 * ALIGN)
        self.out_tensor = torch.empty(size, dtype=torch.uint8, pin_memory=self._pinned)
        self._out = self.out_tensor.numpy()


def _regions(r: PrefillResult, p: PrefillParams) -> Int32Regions:
    """The ``Int32Regions`` of a plan's result (the offsets ``place_int32`` would give)."""
    batch = int(p.batch)
    offsets = {
        "qo_indptr": r.off_qo_indptr,
        "kv_indptr": r.off_kv_indptr,
        "kv_token_start": r.off_kv_token_start,
        "tile_map_start": r.off_tile_map_start,
    }
    counts = dict.fromkeys(offsets, batch + 1)
    if r.off_kv_indices >= 0:
        offsets["kv_indices"], counts["kv_indices"] = r.off_kv_indices, int(p.num_indices)
        offsets["kv_last_page_len"] = r.off_kv_last_page_len
        counts["kv_last_page_len"] = int(p.num_last)
    offsets["items"], counts["items"] = r.off_items, int(r.num_items) * ITEM_INTS
    offsets["merge_items"], counts["merge_items"] = r.off_merge_items, int(r.num_merge) * MERGE_INTS
    return Int32Regions(offsets=offsets, counts=counts, total_bytes=int(r.total_bytes))
