"""Owns: the prefill plan as the runtime holds it: request lengths, the schedule and the
workspace layout ``plan()`` copies to the device (computed by the host planner,
``prefill_planner.py``), and the fixed places of the head lists and the tile map.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.planning.prefill_plan_library import PrefillResult
from attnc.runtime.planning.prefill_planner import ITEM_INTS, MERGE_INTS, PrefillPlanner, regions
from attnc.runtime.planning.workspace import ALIGN, Int32Regions, aligned, place_int32

# The first int32 lists of every plan, each [batch + 1]: their offsets depend on the batch
# size only, so the tile map (built before the schedule) reads them where the kernels do.
HEAD_ARRAYS = ("qo_indptr", "kv_indptr", "kv_token_start", "tile_map_start")


@functools.lru_cache(maxsize=64)
def head_layout(batch: int) -> Int32Regions:
    """Where ``HEAD_ARRAYS`` sit (the start of every plan's lists); one object per batch
    size, shared: do not change it."""
    return place_int32({name: batch + 1 for name in HEAD_ARRAYS})


def map_region_offset(workspace_bytes: int, map_reserve: int) -> int:
    """Byte offset of the tile map: the last ``map_reserve`` bytes of the workspace, a place
    fixed for a wrapper (a CUDA graph captured on run() replays a re-planned map)."""
    return (workspace_bytes - map_reserve) // ALIGN * ALIGN


@dataclass(frozen=True)
class PrefillSchedule:
    """Items (heaviest first, or placed for the Hopper walk: ``walk_ctas``) and merge entries
    of a plan's packed lists; ``part_rows`` partial rows are used. The arrays are views of the
    planner's buffer (valid until its next plan)."""

    buffer: np.ndarray  # uint8: the packed lists
    layout: Int32Regions
    part_rows: int
    chunk_size: int  # KV tokens per chunk of split tiles; 0 when nothing is split
    chunk_cost: np.ndarray  # float64 [num_items / num_kv_heads], heaviest first

    def _rows(self, name: str, width: int) -> np.ndarray:
        at, n = self.layout.offsets[name], self.layout.counts[name]
        return self.buffer[at : at + 4 * n].view(np.int32).reshape(-1, width)

    @property
    def items(self) -> np.ndarray:
        """int32 [num_items, ITEM_INTS] (request, q tile, KV head, begin, end, partial row)."""
        return self._rows("items", ITEM_INTS)

    @property
    def merge_items(self) -> np.ndarray:
        """int32 [num_merge, MERGE_INTS] (request, q tile, chunks, first partial row)."""
        return self._rows("merge_items", MERGE_INTS)

    @property
    def num_items(self) -> int:
        """Work items in the list (a query tile of one request and KV head, or a chunk of one)."""
        return self.layout.counts["items"] // ITEM_INTS

    @property
    def num_merge(self) -> int:
        """Query tiles whose split-KV chunks the merge kernel combines."""
        return self.layout.counts["merge_items"] // MERGE_INTS

    @property
    def cost(self) -> np.ndarray:
        """float64 [num_items]: the items' costs (their chunk's, for every KV head) in the
        heaviest-first order, which is the list's unless the items were placed for the walk."""
        heads = self.num_items // max(self.chunk_cost.shape[0], 1)
        return np.repeat(self.chunk_cost, heads)


@dataclass(frozen=True)
class HostPlan:
    """Everything ``plan()`` decides on the CPU, before copying to the device: the packed
    lists (``buffer``, a view of the planner's buffer valid until its next plan) and what the
    planner said about them (``result``, a copy).

    The workspace holds the int32 lists at ``layout`` offsets, then the fp32 partial O rows
    (``[part_rows, head_dim]`` at ``part_o_offset``) and their LSE (at ``part_lse_offset``).
    """

    buffer: np.ndarray  # uint8 [result.total_bytes]: the packed lists
    result: PrefillResult
    chunk_cost: np.ndarray  # float64 [result.num_chunks], in work-list order
    head_dim: int
    page_size: int
    tile_q_tokens: int
    tile_map_offset: int  # byte offset of the map in the workspace; -1: no map

    @property
    def layout(self) -> Int32Regions:
        """Where each list sits in ``buffer`` (the offsets ``place_int32`` gives)."""
        return regions(self.result)

    @property
    def schedule(self) -> PrefillSchedule:
        """The work list and merge list (views of ``buffer``)."""
        r = self.result
        return PrefillSchedule(self.buffer, self.layout, r.part_rows, r.chunk_size, self.chunk_cost)

    @property
    def batch(self) -> int:
        """Requests of the plan."""
        return int(self.result.batch)

    @property
    def total_q(self) -> int:
        """qo_indptr[-1]."""
        return int(self.result.total_q)

    @property
    def nnz(self) -> int:
        """kv_indptr[-1]: KV tokens (ragged) or pages (paged)."""
        return int(self.result.nnz)

    @property
    def max_page(self) -> int:
        """The largest page id used, -1 when none."""
        return int(self.result.max_page)

    @property
    def paged(self) -> bool:
        """Whether the plan reads a paged KV cache (it has an offset for page ids)."""
        return self.result.off_kv_indices >= 0

    @property
    def part_o_offset(self) -> int:
        """Byte offset of the partial O rows (right after the lists)."""
        return int(self.result.total_bytes)

    @property
    def part_lse_offset(self) -> int:
        """Byte offset of the partial LSE rows."""
        return self.part_o_offset + aligned(4 * self.head_dim * self.result.part_rows)

    @property
    def total_bytes(self) -> int:
        """Workspace bytes the plan uses."""
        return self.part_lse_offset + 4 * int(self.result.part_rows)

    def region(self, name: str) -> np.ndarray | None:
        """The int32 list ``name`` of the packed buffer (None when the plan has none)."""
        layout = self.layout
        if name == "tile_map_start" and self.tile_map_offset < 0:
            return None
        if name not in layout.offsets:
            return None
        at, n = layout.offsets[name], layout.counts[name]
        return self.buffer[at : at + 4 * n].view(np.int32)

    @property
    def qo_indptr(self) -> np.ndarray:
        """int32 ``[batch + 1]``: the planned qo_indptr."""
        return self.region("qo_indptr")  # type: ignore[return-value]

    @property
    def kv_indptr(self) -> np.ndarray:
        """int32 ``[batch + 1]``: the planned kv_indptr (pages when paged)."""
        return self.region("kv_indptr")  # type: ignore[return-value]

    @property
    def kv_token_start(self) -> np.ndarray:
        """int32 ``[batch + 1]``: request b's first flattened KV token."""
        return self.region("kv_token_start")  # type: ignore[return-value]

    @property
    def tile_map_start(self) -> np.ndarray | None:
        """int32 ``[batch + 1]``: where each request's map starts (None without a map)."""
        return self.region("tile_map_start")

    @property
    def q_lens(self) -> np.ndarray:
        """int64 [batch]: query tokens per request."""
        return np.diff(self.qo_indptr.astype(np.int64))

    @property
    def kv_lens(self) -> np.ndarray:
        """int64 [batch]: KV tokens per request."""
        return np.diff(self.kv_token_start.astype(np.int64))

    def packed(self) -> torch.Tensor:
        """The CPU byte buffer of the lists, to copy to the start of the workspace."""
        return torch.from_numpy(self.buffer)


def host_plan(
    planner: PrefillPlanner,
    head_dim: int,
    program: RangeProgram | None = None,
    tile_map: np.ndarray | None = None,
    map_on_device: bool = False,
) -> HostPlan:
    """Plan the batch ``planner`` last checked, in the shape it was configured with (its
    buffers hold the lists until its next plan).

    With ``tile_map`` (the uint8 host copy of the map ``plan()`` built) tiles are ranged and
    costed by their non-empty map blocks; the map itself sits in the last ``map_reserve``
    bytes. With ``map_on_device`` instead, tiles keep their closed-form ranges and costs, but
    the plan has a map's layout (its starts written, its region in the last ``map_reserve``
    bytes) for a map the device builds after the copy. Raises ``ValueError`` naming
    ``workspace_buffer`` when the lists alone, or the map, do not fit.
    """
    planner.plan(program, tile_map)
    p = planner.params
    mapped = tile_map is not None or map_on_device
    offset = map_region_offset(p.workspace_bytes, p.map_reserve) if mapped else -1
    if tile_map is None and map_on_device:
        _write_map_starts(planner)
    return HostPlan(
        planner.buffer, PrefillResult.from_buffer_copy(planner.result), planner.chunk_cost,
        head_dim, p.page_size, p.tile_q_tokens, offset,
    )  # fmt: skip


# The kernels index the tile map, and its starts in the plan, with 32-bit ints, and the map
# kernel steps over its entries by up to 2**18 at a time (65536 blocks of 4 warps): the
# margin keeps the step past the last entry inside int32.
MAX_MAP_ENTRIES = 2**31 - 2**20


def check_map_fits(entries: int, map_reserve: int) -> None:
    """Raise a ``ValueError`` when a map of ``entries`` bytes (one a tile) has more entries
    than the kernels can index (naming the requests' ``qo_indptr`` and ``kv_indptr``), or
    does not fit in the wrapper's ``map_reserve`` (naming ``workspace_buffer``)."""
    if entries > MAX_MAP_ENTRIES:
        raise ValueError(
            f"qo_indptr, kv_indptr: these requests' tile map has {entries} tiles, past the "
            f"{MAX_MAP_ENTRIES} the kernels step through with 32-bit ints; plan fewer or shorter "
            "requests at a time"
        )
    if entries > map_reserve:
        raise ValueError(
            f"workspace_buffer: the tile map needs {entries} bytes, the wrapper keeps "
            f"{map_reserve} (max_tile_map_bytes)"
        )


def _write_map_starts(planner: PrefillPlanner) -> None:
    """Write each request's map start (``PrefillPlanner.map_starts``) into the planned lists, for a
    map built on the device after the copy."""
    p, r = planner.params, planner.result
    starts = planner.map_starts(int(p.tile_q_tokens))
    check_map_fits(int(starts[-1]), int(p.map_reserve))
    at = int(r.off_tile_map_start)
    planner.buffer[at : at + 4 * (int(r.batch) + 1)].view(np.int32)[:] = starts
