"""Owns: the Python binding of the host prefill planner, the C++ library built from
``attnc/kernels/host/prefill_plan*`` (``prefill_plan_library.py``) and called through ctypes.

A ``PrefillPlanner`` is made once per wrapper and keeps its buffers between plans: the
per-request lengths, the checked tables, the byte buffer the packed lists are written into
(pinned when the lists are copied to a CUDA workspace, grown when a batch needs more) and the
chunk costs. ``check`` copies the int32 batch description into a buffer of its own (the
caller's tensors are read once: what is checked is what is planned), validates the copy and
derives each request's lengths; ``configure`` sets the shape (kept while it repeats); ``plan``
then writes the whole work list (tile KV ranges from the mask's closed form and the tile map,
split-KV chunks, the heaviest-first order, the merge list) in one C call. A failed check is
reported as ``False``; ``failure()`` then is its error, worded by ``checks/page_table.py``,
and nothing may be planned until a check passes.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from attnc.runtime import abi
from attnc.runtime.checks import page_table
from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.planning.prefill_plan_library import (
    PP_COPY_BUFFER,
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
# A copy buffer past this many int32 entries (4 MiB) is not kept after a refused check: a
# hostile table then holds no memory for the planner's life (a passing one keeps its size).
KEEP_COPY_INTS = 1 << 20
OUT_OF_RANGE_MESSAGE = (
    "prefill plan: the batch is beyond the planner's limits (positive head counts, tile and "
    "chunk sizes below 2^30, a tile map at least as long as the batch needs); nothing was "
    "planned"
)


_EMPTY_TABLE = np.zeros(1, np.int32)  # what an empty page table points at (never read)


def _address(table: torch.Tensor) -> int:
    """The address of a host int32 table; a non-null one for an empty table."""
    return table.data_ptr() if table.numel() else _EMPTY_TABLE.ctypes.data


class PrefillPlanner:
    """The host prefill planner with its reused buffers (``pinned``: page-locked output)."""

    def __init__(self, pinned: bool = False) -> None:
        self._lib = library()
        self._pinned = pinned
        self._p, self._r = PrefillParams(), PrefillResult()
        self._p_ref, self._r_ref = ctypes.byref(self._p), ctypes.byref(self._r)
        p = self._p
        p.alpha, p.beta, p.min_chunk, p.max_chunks = ALPHA, BETA, MIN_CHUNK, MAX_CHUNKS
        self._lens = np.zeros((3, 0), np.int64)
        self._starts_ptr = 0
        self._new_copy_buffer(1024)
        # checked_indptrs(): the copy buffer and entries its two views were cut for.
        self._views: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None
        self._cost = np.zeros(1024, np.float64)
        p.out_cost, p.out_cost_cap = self._cost.ctypes.data, self._cost.shape[0]
        self.out_tensor = torch.zeros(0, dtype=torch.uint8, device="cpu")
        self._out = self.out_tensor.numpy()
        self._shape: tuple[int, ...] = ()
        self.batch = 0
        self._passed = False  # the last check passed: its copies are what plan() reads

    @property
    def result(self) -> PrefillResult:
        """The last call's result struct (totals after ``check``, counts after ``plan``)."""
        return self._r

    @property
    def params(self) -> PrefillParams:
        """The parameter struct (the last check's batch, the configured shape)."""
        return self._p

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
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor | None,
        kv_last_page_len: torch.Tensor | None,
        page_size: int,
    ) -> bool:
        """Validate contiguous CPU int32 tensors (page ids and last-page lengths for paged
        KV) and derive the lengths; False when a check fails (``failure()`` says which).

        The planner reads each tensor once: what it checks is a copy of its own, which
        ``plan()`` packs and ``checked_indptrs`` returns, whatever the caller's tensors hold
        by then."""
        p = self._p
        self._passed = False
        if self._lens.shape[1] < qo_indptr.shape[0]:
            self._lens = np.zeros((3, 2 * qo_indptr.shape[0]), np.int64)  # q, kv, map starts
            p.q_lens, p.kv_lens = self._lens[0].ctypes.data, self._lens[1].ctypes.data
            self._starts_ptr = self._lens[2].ctypes.data
            p.lens_cap = self._lens.shape[1]
        while True:
            self._point_at(qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
            p.page_size = page_size
            rc = self._lib.attnc_prefill_check(self._p_ref, self._r_ref)
            if rc != abi.PLAN_CAPACITY or self._r.error != PP_COPY_BUFFER:
                break
            self._new_copy_buffer(max(int(self._r.needed_bytes) // 4, 2 * self._copy.shape[0]))
        abi.raise_if_no_memory(rc, "prefill plan")
        if rc == abi.PLAN_INVALID:
            if self._copy.shape[0] > KEEP_COPY_INTS:  # grown for tables it then refused
                self._new_copy_buffer(1024)
            return False
        if rc != abi.PLAN_OK:
            raise RuntimeError(f"attnc: prefill plan: check returned {rc}")
        self.batch = p.batch
        self._passed = True
        return True

    def _new_copy_buffer(self, ints: int) -> None:
        """Where the check copies the tables: ``ints`` int32 entries on the CPU (whatever
        torch's default device)."""
        self._copy = torch.empty(ints, dtype=torch.int32, device="cpu")
        self._p.copy, self._p.copy_cap = self._copy.data_ptr(), ints

    def _point_at(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor | None,
        kv_last_page_len: torch.Tensor | None,
    ) -> None:
        """The parameters point at the caller's tables (the check moves them to its copies)."""
        p = self._p
        p.qo_indptr, p.qo_len = qo_indptr.data_ptr(), qo_indptr.shape[0]
        p.kv_indptr, p.kv_len = kv_indptr.data_ptr(), kv_indptr.shape[0]
        if kv_indices is None or kv_last_page_len is None:
            p.kv_indices = p.kv_last_page_len = None
            p.num_indices = p.num_last = 0
        else:
            # A null page table means ragged KV to the C++ side, and an empty tensor's
            # data_ptr() is 0: an empty table points at a word of its own instead.
            p.kv_indices, p.num_indices = _address(kv_indices), kv_indices.shape[0]
            p.kv_last_page_len = _address(kv_last_page_len)
            p.num_last = kv_last_page_len.shape[0]

    def checked_indptrs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 ``[batch + 1]`` each: the qo_indptr and kv_indptr the last passing ``check``
        read (views of the planner's copies, valid until its next check)."""
        self._require_check("checked_indptrs")
        n, views = self.batch + 1, self._views
        if views is None or views[0] is not self._copy or views[1] != n:
            # Kept while the buffer and the batch size repeat: slicing costs about as much
            # as the check.
            views = self._views = (self._copy, n, self._copy[:n], self._copy[n : 2 * n])
        return views[2], views[3]

    def _require_check(self, name: str) -> None:
        """Refuse ``name`` unless the last ``check`` passed: after a refused one the
        parameters still point at the caller's tables, which may be gone."""
        if not self._passed:
            raise RuntimeError(f"attnc: prefill plan: {name}() needs tables that check() passed")

    def failure(self) -> ValueError:
        """The error of the last ``check`` that returned False: the check that failed first
        (in the order of ``prefill_batch.check_indices``) and where."""
        r = self._r
        return page_table.planner_error(
            int(r.error), int(r.index), int(r.value), int(r.value2), int(self._p.page_size)
        )

    def map_starts(self, tile_q_tokens: int, kv_block: int = abi.TILE_MAP_KV_BLOCK) -> np.ndarray:
        """int64 [batch + 1]: where each request's tile map starts in the last checked batch
        (tests/tile_map_oracle.py ``map_starts``; a reused buffer, valid until the next call)."""
        self._require_check("map_starts")
        if tile_q_tokens < 1 or kv_block < 1:  # the library divides by both
            raise ValueError(
                f"prefill plan: tile map of {tile_q_tokens}-token query tiles and "
                f"{kv_block}-key blocks: both must be at least 1"
            )
        self._lib.attnc_prefill_map_starts(self._p_ref, tile_q_tokens, kv_block, self._starts_ptr)
        return self._lens[2, : self.batch + 1]

    def configure(
        self, num_qo_heads: int, num_kv_heads: int, head_dim: int, tile_q_tokens: int,
        num_ctas: int, workspace_bytes: int, map_reserve: int = 0, kv_align: int = KV_ALIGN,
        kv_block: int = abi.TILE_MAP_KV_BLOCK, walk_ctas: int = 0,
    ) -> None:  # fmt: skip
        """The scalars of the following plans (ints). ``walk_ctas`` > 0: the kernel runs the
        list by the alternating walk over that many CTAs at most (the Hopper template), and
        the items are placed for it (prefill_plan_walk.h); 0: the list stays heaviest first."""
        shape = (num_qo_heads, num_kv_heads, head_dim, tile_q_tokens, num_ctas, workspace_bytes,
                 map_reserve, kv_align, kv_block, walk_ctas)  # fmt: skip
        if shape == self._shape:
            return
        p = self._p
        p.num_qo_heads, p.num_kv_heads, p.head_dim, p.tile_q_tokens = shape[:4]
        (p.num_ctas, p.workspace_bytes, p.map_reserve, p.kv_align, p.kv_block,
         p.walk_ctas) = shape[4:]  # fmt: skip
        self._shape = shape

    def plan(self, program: RangeProgram | None = None, tile_map: np.ndarray | None = None) -> None:
        """Plan the last checked batch (``tile_map``: uint8 host classes) into the buffer;
        ``result`` holds the counts and offsets, ``buffer``/``chunk_cost`` the lists."""
        self._require_check("plan")
        p = self._p
        extra = None if program is None else program.extra(self.q_lens, self.kv_lens)
        alive = p.ranges.set(program, extra)
        if tile_map is None:
            p.tile_map, p.tile_map_len = None, 0
        else:
            p.tile_map, p.tile_map_len = address(tile_map), tile_map.shape[0]
        self._run()
        del alive  # read by the call above

    @property
    def buffer(self) -> np.ndarray:
        """uint8: the packed lists of the last plan (valid until the next one)."""
        return self._out[: self._r.total_bytes]

    @property
    def chunk_cost(self) -> np.ndarray:
        """float64 [chunks]: the last plan's chunk costs in work-list order."""
        return self._cost[: self._r.num_chunks]

    def _run(self) -> None:
        p, r = self._p, self._r
        while True:
            rc = self._lib.attnc_prefill_plan(self._p_ref, self._r_ref)
            if rc == abi.PLAN_CAPACITY and r.error == PP_OUT_BUFFER:
                self._grow(int(r.needed_bytes))
            elif rc == abi.PLAN_CAPACITY and r.error == PP_COST_BUFFER:
                self._cost = np.zeros(2 * int(r.needed_bytes), np.float64)
                p.out_cost, p.out_cost_cap = self._cost.ctypes.data, self._cost.shape[0]
            else:
                break
        abi.raise_if_no_memory(rc, "prefill plan")
        if rc == abi.PLAN_CAPACITY and r.error == PP_WORKSPACE:
            raise ValueError(_workspace_refusal(p.workspace_bytes, p.map_reserve, r.needed_bytes))
        if rc == abi.PLAN_OUT_OF_RANGE:
            raise ValueError(OUT_OF_RANGE_MESSAGE)
        if rc != abi.PLAN_OK:
            raise RuntimeError(f"attnc: prefill plan: the planner returned {rc}")

    @property
    def out_address(self) -> int:
        """The address of the buffer the packed lists are written into (``out_tensor``'s)."""
        return int(self._p.out or 0)

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._out.shape[0], 64 * ALIGN)
        self.out_tensor = torch.empty(
            size, dtype=torch.uint8, pin_memory=self._pinned, device="cpu"
        )
        self._out = self.out_tensor.numpy()
        self._p.out, self._p.out_bytes = self._out.ctypes.data, size


def address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's first element (cheaper than ``.ctypes``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # read-only or empty
        return int(array.ctypes.data)


def regions(r: PrefillResult) -> Int32Regions:
    """The ``Int32Regions`` of a plan's result (the offsets ``place_int32`` gives)."""
    offsets = {
        "qo_indptr": r.off_qo_indptr,
        "kv_indptr": r.off_kv_indptr,
        "kv_token_start": r.off_kv_token_start,
        "tile_map_start": r.off_tile_map_start,
    }
    counts = dict.fromkeys(offsets, r.batch + 1)
    if r.off_kv_indices >= 0:
        offsets["kv_indices"], counts["kv_indices"] = r.off_kv_indices, r.num_indices
        offsets["kv_last_page_len"] = r.off_kv_last_page_len
        counts["kv_last_page_len"] = r.num_last
    offsets["items"], counts["items"] = r.off_items, r.num_items * ITEM_INTS
    offsets["merge_items"], counts["merge_items"] = r.off_merge_items, r.num_merge * MERGE_INTS
    return Int32Regions(offsets=offsets, counts=counts, total_bytes=r.total_bytes)


def _workspace_refusal(workspace_bytes: int, map_reserve: int, needed: int) -> str:
    """Why the work lists do not fit: the workspace minus the tile map's reserve is short."""
    if map_reserve <= 0:
        return f"workspace_buffer: has {workspace_bytes} bytes, the work lists need {needed}"
    return (
        f"workspace_buffer: has {workspace_bytes} bytes, of which the last {map_reserve} are "
        f"kept for the tile map (max_tile_map_bytes), and the work lists need {needed}: give "
        "a larger workspace or a smaller max_tile_map_bytes"
    )
