"""The prefill plan: request lengths, the schedule (``prefill_schedule``) and the workspace
layout ``plan()`` copies to the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnc.runtime.planning.prefill_schedule import (
    ITEM_INTS,
    PrefillSchedule,
    TileRanges,
    schedule_prefill,
)
from attnc.runtime.planning.tile_map import TileMapSummary, map_starts, ranges_with_map
from attnc.runtime.planning.workspace import ALIGN, Int32Regions, aligned, pack_int32, place_int32

# The first int32 lists of every plan, each [batch + 1]: their offsets depend on the batch
# size only, so the tile map (built before the schedule) reads them where the kernels do.
HEAD_ARRAYS = ("qo_indptr", "kv_indptr", "kv_token_start", "tile_map_start")


def kv_lengths_paged(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Tokens per request of a paged cache: ``(pages - 1) * page_size + last``, 0 without pages."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    lengths = (pages - 1) * page_size + kv_last_page_len
    return torch.where(pages > 0, lengths, torch.zeros_like(lengths))


def lengths(indptr: torch.Tensor) -> torch.Tensor:
    """Per-request sizes of a token indptr."""
    return indptr[1:] - indptr[:-1]


def kv_token_starts(kv_lens: torch.Tensor) -> torch.Tensor:
    """int64 ``[batch + 1]``: request b's first flattened KV token (prefix sums of kv_len;
    for ragged KV this is kv_indptr)."""
    out = torch.zeros(kv_lens.numel() + 1, dtype=torch.int64)
    torch.cumsum(kv_lens.to(torch.int64), 0, out=out[1:])
    return out


def head_layout(batch: int) -> Int32Regions:
    """Where ``HEAD_ARRAYS`` sit (the start of every plan's lists)."""
    return place_int32({name: batch + 1 for name in HEAD_ARRAYS})


def map_region_offset(workspace_bytes: int, map_reserve: int) -> int:
    """Byte offset of the tile map: the last ``map_reserve`` bytes of the workspace, a place
    fixed for a wrapper (a CUDA graph captured on run() replays a re-planned map)."""
    return (workspace_bytes - map_reserve) // ALIGN * ALIGN


PART_ROW_RESERVE = 32  # list bytes a partial row may add (one item of 8 int32 per chunk)


@dataclass(frozen=True)
class HostPlan:
    """Everything ``plan()`` decides on the CPU, before copying to the device.

    The workspace holds the int32 lists at ``layout`` offsets, then the fp32 partial O rows
    (``[part_rows, head_dim]`` at ``part_o_offset``) and their LSE (at ``part_lse_offset``).
    """

    qo_indptr: torch.Tensor  # CPU int64 [batch + 1]
    kv_indptr: torch.Tensor  # CPU int64 [batch + 1]
    q_lens: torch.Tensor
    kv_lens: torch.Tensor
    kv_token_start: torch.Tensor  # CPU int64 [batch + 1]
    tile_map_start: torch.Tensor | None  # CPU int64 [batch + 1] when the plan has a map
    tile_map_offset: int  # byte offset of the map in the workspace; -1: no map
    kv_indices: torch.Tensor | None  # CPU int64 [nnz pages], paged only
    kv_last_page_len: torch.Tensor | None  # CPU int64 [batch], paged only
    page_size: int
    tile_q_tokens: int
    schedule: PrefillSchedule
    layout: Int32Regions
    part_o_offset: int
    part_lse_offset: int

    @property
    def total_bytes(self) -> int:
        """Workspace bytes the plan uses."""
        return self.part_lse_offset + 4 * self.schedule.part_rows

    @property
    def paged(self) -> bool:
        return self.kv_indices is not None

    @property
    def max_page(self) -> int:
        """The largest page id used, -1 when none."""
        if self.kv_indices is None or self.kv_indices.numel() == 0:
            return -1
        return int(self.kv_indices.max())

    def packed(self) -> torch.Tensor:
        """The CPU byte buffer of the lists, to copy to the start of the workspace."""
        arrays = {
            "qo_indptr": self.qo_indptr,
            "kv_indptr": self.kv_indptr,
            "kv_token_start": self.kv_token_start,
            "items": torch.from_numpy(self.schedule.items),
            "merge_items": torch.from_numpy(self.schedule.merge_items),
        }
        if self.tile_map_start is not None:
            arrays["tile_map_start"] = self.tile_map_start
        if self.kv_indices is not None and self.kv_last_page_len is not None:
            arrays["kv_indices"] = self.kv_indices
            arrays["kv_last_page_len"] = self.kv_last_page_len
        return pack_int32(self.layout, arrays)


def plan_kv_lengths(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor | None, page_size: int
) -> torch.Tensor:
    """KV tokens per request: from the page counts and last-page lengths (paged, when
    ``kv_last_page_len`` is given) or the token indptr (ragged)."""
    if kv_last_page_len is not None:
        return kv_lengths_paged(kv_indptr, kv_last_page_len, page_size)
    return lengths(kv_indptr)


@dataclass(frozen=True)
class PlanShape:
    """What the planner needs to know about heads, the kernel and the workspace."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    tile_q_tokens: int
    num_ctas: int  # CTAs the device holds at once (SMs x CTAs per SM)
    workspace_bytes: int
    kv_align: int = 128


def make_host_plan(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    page_size: int,
    shape: PlanShape,
    tile_ranges: TileRanges | None = None,
    tile_map: TileMapSummary | None = None,
    map_reserve: int = 0,
) -> HostPlan:
    """Schedule and workspace layout from checked host index tensors (int64, CPU).

    With ``tile_map`` (the summary of the map ``plan()`` built) tiles are ranged and costed
    by their non-empty map blocks; the map itself sits in the last ``map_reserve`` bytes.
    Raises ``ValueError`` naming ``workspace_buffer`` when the lists alone do not fit.
    """
    q_lens = lengths(qo_indptr)
    paged = kv_indices is not None and kv_last_page_len is not None
    kv_lens = plan_kv_lengths(kv_indptr, kv_last_page_len if paged else None, page_size)
    base = {name: qo_indptr.numel() for name in HEAD_ARRAYS}
    if paged:
        base["kv_indices"] = kv_indices.numel()  # type: ignore[union-attr]
        base["kv_last_page_len"] = kv_last_page_len.numel()  # type: ignore[union-attr]
    q_np, kv_np = q_lens.numpy(), kv_lens.numpy()
    tiles = int((-(-q_np // shape.tile_q_tokens)).sum())
    unsplit = place_int32(
        {**base, "items": tiles * shape.num_kv_heads * ITEM_INTS, "merge_items": 0}
    )
    free = shape.workspace_bytes - unsplit.total_bytes - 4 * ALIGN - map_reserve
    if free < 0:
        raise ValueError(
            f"workspace_buffer: has {shape.workspace_bytes} bytes, the work lists need "
            f"{unsplit.total_bytes + 4 * ALIGN}"
        )
    max_part_rows = free // (4 * (shape.head_dim + 1) + PART_ROW_RESERVE)
    cost = None
    if tile_map is not None:
        tile_ranges, cost = ranges_with_map(tile_map, tile_ranges), tile_map.visible_tokens
    sched = schedule_prefill(
        q_np, kv_np, shape.tile_q_tokens, shape.num_qo_heads, shape.num_kv_heads,
        shape.num_ctas, shape.kv_align, max_part_rows, tile_ranges, cost,
    )  # fmt: skip
    layout = place_int32({**base, "items": sched.items.size, "merge_items": sched.merge_items.size})
    part_o = layout.total_bytes
    part_lse = part_o + aligned(4 * shape.head_dim * sched.part_rows)
    return HostPlan(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_token_start=kv_token_starts(kv_lens),
        tile_map_start=(
            None
            if tile_map is None
            else torch.from_numpy(map_starts(q_np, kv_np, shape.tile_q_tokens, tile_map.kv_block))
        ),
        tile_map_offset=(
            -1 if tile_map is None else map_region_offset(shape.workspace_bytes, map_reserve)
        ),
        kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len,
        page_size=page_size,
        tile_q_tokens=shape.tile_q_tokens,
        schedule=sched,
        layout=layout,
        part_o_offset=part_o,
        part_lse_offset=part_lse,
    )
