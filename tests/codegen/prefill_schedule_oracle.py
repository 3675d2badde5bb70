"""The oracle of the prefill planner: the numpy scheduler the C++ planner
(attnc/kernels/host/prefill_plan*) is checked against, byte for byte
(tests/codegen/test_prefill_plan_native.py), and what the unit tests of the cost model run.
Not used by the runtime.

A work item is (request, query tile, KV head, KV chunk ``[begin, end)``) with cost
``alpha * l_q + beta * l_kv`` (``l_q`` query tokens of the tile, ``l_kv`` KV tokens it may
see: the mask's ``kv_range`` when it is known at plan time, else the request's KV length;
with a tile map, only the KV of its non-empty blocks: ``KvCost``).
Work runs one item per CTA in list order, so the list is sorted heaviest first (stable: the
same lengths always give the same plan). A tile whose KV range is longer than the fair share
of one CTA (total cost / (CTAs per SM x SMs)) is cut into tile-aligned chunks; its chunks
write fp32 partial states that the merge kernel combines in chunk order (no atomics, so the
result is bit-identical run to run). Splitting stops when the partial states would not fit
the workspace. ``oracle_plan`` packs the lists as ``BatchPrefillWrapper.plan()`` copies them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from mask_ranges_oracle import TileRanges, query_tiles  # the KV each tile may see; the tiles
from prefill_plan_helpers import kv_token_starts
from prefill_plan_helpers import plan_kv_lengths as _kv_lengths
from tile_map_oracle import map_starts

from attnc.runtime.planning.prefill_plan import HEAD_ARRAYS
from attnc.runtime.planning.tile_map import TileMapSummary
from attnc.runtime.planning.workspace import ALIGN, Int32Regions, aligned, place_int32

# (tile index in query_tiles order, kv_begin, kv_end) -> KV tokens the kernel loads there
# (a tile map's non-empty blocks); None: every token of the range.
KvCost = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

ALPHA = 1.0  # cost of one query token of a tile, in KV tokens
BETA = 1.0  # cost of one KV token
MIN_CHUNK = 512  # never cut a tile's KV range into chunks shorter than this
MAX_CHUNKS = 64  # chunks per tile at most
ITEM_INTS = 8  # prefill_args.h: ATTNC_PI_SIZE
MERGE_INTS = 4  # prefill_args.h: ATTNC_PM_SIZE
PART_ROW_RESERVE = 32  # list bytes a partial row may add (one item of 8 int32 per chunk)
WALK_ITEM_COST = 112.0  # prefill_plan_walk.h: kWalkItemCost
WALK_MAX_ROUNDS = 5  # prefill_plan_walk.h: kWalkMaxRounds
WALK_SLACK = 0.02  # prefill_plan_walk.h: kWalkSlack
WALK_STEPS_PER_CTA = 4  # prefill_plan_walk.h: kWalkStepsPerCta


@dataclass(frozen=True)
class OracleSchedule:
    """Items (heaviest first, or placed for the walk: ``balance_walk``) and merge entries;
    ``part_rows`` partial rows are used."""

    items: np.ndarray  # int32 [num_items, ITEM_INTS]
    merge_items: np.ndarray  # int32 [num_merge, MERGE_INTS]
    part_rows: int
    chunk_size: int  # KV tokens per chunk of split tiles; 0 when nothing is split
    cost: np.ndarray  # float64 [num_items], heaviest first (the list's order without a walk)

    @property
    def num_items(self) -> int:
        return int(self.items.shape[0])

    @property
    def num_merge(self) -> int:
        return int(self.merge_items.shape[0])


def _chunking(
    length: np.ndarray, chunk: int, kv_align: int, work: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Chunks per tile (by its ``work``: the KV it loads, default its length) and the
    (aligned) chunk size of each tile."""
    n = np.clip(-(-(length if work is None else work) // chunk), 1, MAX_CHUNKS)
    size = -(-length // n)
    size = np.maximum(kv_align, -(-size // kv_align) * kv_align)
    return np.maximum(1, -(-length // size)), size


def schedule_prefill(
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    tile_q_tokens: int,
    num_qo_heads: int,
    num_kv_heads: int,
    num_ctas: int,
    kv_align: int,
    max_part_rows: int,
    tile_ranges: TileRanges | None = None,
    kv_cost: KvCost | None = None,
    *,
    alpha: float = ALPHA,
    beta: float = BETA,
    min_chunk: int = MIN_CHUNK,
    walk_ctas: int = 0,
) -> OracleSchedule:
    """Work items and merge entries of one batched prefill (see the module doc); with
    ``walk_ctas`` the items placed for the Hopper kernel's walk (``balance_walk``)."""
    kv = np.asarray(kv_lens, dtype=np.int64)
    req, j, q0, q1 = query_tiles(q_lens, tile_q_tokens)
    if tile_ranges is None:
        kv_b, kv_e = np.zeros_like(req), kv[req]
    else:
        kv_b, kv_e = tile_ranges(req, q0, q1, np.asarray(q_lens, dtype=np.int64), kv)
        kv_b = np.clip(np.asarray(kv_b, dtype=np.int64), 0, kv[req])
        kv_e = np.clip(np.asarray(kv_e, dtype=np.int64), kv_b, kv[req])
    length = kv_e - kv_b
    tokens = q1 - q0
    rows = tokens * num_qo_heads
    every = np.arange(req.shape[0], dtype=np.int64)
    loaded = length if kv_cost is None else kv_cost(every, kv_b, kv_e)

    chunk = _chunk_size(loaded, tokens, num_kv_heads, num_ctas, kv_align, alpha, beta, min_chunk)
    n, size = _chunking(length, chunk, kv_align, loaded)
    while True:
        split = n > 1
        part_rows = int((n[split] * rows[split]).sum())
        if part_rows <= max_part_rows or not split.any():
            break
        chunk *= 2
        n, size = _chunking(length, chunk, kv_align, loaded)
    if not split.any():
        chunk = 0

    # Chunks of every tile: (tile t, chunk index c, begin, end).
    t_of = np.repeat(np.arange(req.shape[0], dtype=np.int64), n)
    first = np.cumsum(n) - n
    c = np.arange(int(n.sum()), dtype=np.int64) - first[t_of]
    begin = kv_b[t_of] + c * size[t_of]
    end = np.minimum(begin + size[t_of], kv_e[t_of])
    split_rows = np.where(split, n * rows, 0)
    part_base = np.cumsum(split_rows) - split_rows
    part = np.where(split[t_of], part_base[t_of] + c * rows[t_of], -1)

    loads = (end - begin) if kv_cost is None else kv_cost(t_of, begin, end)
    cost = alpha * tokens[t_of] + beta * loads
    order = np.argsort(-cost, kind="stable")
    items3 = np.zeros((order.shape[0], num_kv_heads, ITEM_INTS), dtype=np.int32)
    items3[:, :, 0] = req[t_of[order], None]
    items3[:, :, 1] = j[t_of[order], None]
    items3[:, :, 2] = np.arange(num_kv_heads)
    items3[:, :, 3] = begin[order, None]
    items3[:, :, 4] = end[order, None]
    items3[:, :, 5] = part[order, None]

    items = items3.reshape(-1, ITEM_INTS)
    items = items[balance_walk(np.repeat(cost[order], num_kv_heads) + WALK_ITEM_COST, walk_ctas)]
    tiles = np.flatnonzero(split)
    merge = np.zeros((tiles.shape[0], MERGE_INTS), dtype=np.int32)
    merge[:, 0] = req[tiles]
    merge[:, 1] = j[tiles]
    merge[:, 2] = n[tiles]
    merge[:, 3] = part_base[tiles]
    return OracleSchedule(
        items=items,
        merge_items=merge,
        part_rows=part_rows,
        chunk_size=int(chunk),
        cost=np.repeat(cost[order], num_kv_heads),
    )


def _walk_ctas(n: int, g: int) -> np.ndarray:
    """The CTA of each list position in the alternating walk over g CTAs."""
    q = np.arange(n, dtype=np.int64)
    r, k = q // g, q % g
    return np.where(r % 2 == 0, k, g - 1 - k)


def balance_walk(w: np.ndarray, walk_ctas: int) -> np.ndarray:
    """The list index (heaviest first) to place at each position for the walk over
    g = min(n, walk_ctas) CTAs, from the items' balance costs ``w`` (their cost plus
    WALK_ITEM_COST, non-increasing). At most WALK_STEPS_PER_CTA * g times, the busiest CTA
    (the lowest index of the highest load) exchanges items with the least loaded CTA below its
    load (ties: the lower index) for which an exchange moving 0 < d < (their loads' gap)
    exists: one item for one if any, else two for two, the one of lowest |gap - 2d| (the first
    of equals, positions taken in itertools.combinations order). It stops when no CTA can
    take any. Then each CTA's items run heaviest first (ties: list order). The identity
    without a walk, with one item or more than WALK_MAX_ROUNDS a CTA, or when no CTA of the
    walk is WALK_SLACK above the mean."""
    n = w.shape[0]
    at = np.arange(n, dtype=np.int64)
    if walk_ctas <= 0 or n == 0:
        return at
    g = min(n, walk_ctas)
    rounds = -(-n // g)
    if rounds < 2 or rounds > WALK_MAX_ROUNDS:
        return at
    cta = _walk_ctas(n, g)
    cost = [float(x) for x in w]
    load = [0.0] * g
    total = 0.0
    for q in range(n):  # in position order, as the planner adds
        load[cta[q]] += cost[q]
        total += cost[q]
    if not max(load) * g > total * (1.0 + WALK_SLACK):
        return at
    slots = [np.flatnonzero(cta == b).tolist() for b in range(g)]  # each in round order
    place = list(range(n))
    for _ in range(WALK_STEPS_PER_CTA * g):
        if not _exchange_step(cost, place, load, slots):
            break
    at = np.array(place, dtype=np.int64)
    for b in range(g):
        mine = slots[b]
        at[mine] = sorted(at[mine].tolist(), key=lambda i: (-w[i], i))
    return at


def _exchange_step(cost: list, place: list, load: list, slots: list) -> bool:
    """One exchange of balance_walk (place and load updated); False when none exists."""
    order = sorted(range(len(load)), key=lambda b: (load[b], b))
    la = load[order[-1]]
    a = min(b for b in range(len(load)) if load[b] == la)

    def weight(xs: tuple) -> float:
        return cost[place[xs[0]]] if len(xs) == 1 else cost[place[xs[0]]] + cost[place[xs[1]]]

    for b in order:
        if not load[b] < la:
            return False
        gap = la - load[b]
        best = None
        for k in (1, 2):
            if best is not None:
                break
            for xa in itertools.combinations(slots[a], k):
                for xb in itertools.combinations(slots[b], k):
                    d = weight(xa) - weight(xb)
                    if 0.0 < d < gap and (best is None or abs(gap - 2.0 * d) < best[0]):
                        best = (abs(gap - 2.0 * d), xa, xb, d)
        if best is None:
            continue
        _, xa, xb, d = best
        for x, q in zip(xa, xb, strict=True):
            place[x], place[q] = place[q], place[x]
        load[a] -= d
        load[b] += d
        return True
    return False


def _chunk_size(
    length: np.ndarray,
    tokens: np.ndarray,
    num_kv_heads: int,
    num_ctas: int,
    kv_align: int,
    alpha: float,
    beta: float,
    min_chunk: int,
) -> int:
    """A CTA's fair share of the KV work, tile-aligned and at least ``min_chunk``."""
    total = num_kv_heads * float((alpha * tokens + beta * length).sum())
    per_cta = total / max(num_ctas, 1)
    chunk = max(min_chunk, int(per_cta / beta))
    return -(-chunk // kv_align) * kv_align


def ranges_with_map(summary: TileMapSummary, inner: TileRanges | None) -> TileRanges:
    """``TileRanges`` narrowed to each tile's non-empty map columns (and to ``inner``'s
    closed-form range when given). Tiles are asked for in ``query_tiles`` order."""

    def ranges(
        req: np.ndarray, q0: np.ndarray, q1: np.ndarray, q_lens: np.ndarray, kv_lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        kv = kv_lens[req]
        begin = np.minimum(summary.first * summary.kv_block, kv)
        end = np.minimum(summary.end * summary.kv_block, kv)
        if inner is not None:
            b, e = inner(req, q0, q1, q_lens, kv_lens)
            begin, end = np.maximum(begin, b), np.minimum(end, e)
        live = begin < end
        return np.where(live, begin, 0), np.where(live, end, 0)

    return ranges


@dataclass(frozen=True)
class OraclePlan:
    """The packed lists and the offsets the old ``make_host_plan`` gave."""

    packed: np.ndarray  # uint8 [layout.total_bytes]
    layout: Int32Regions
    schedule: OracleSchedule
    part_o_offset: int
    part_lse_offset: int


def oracle_plan(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    page_size: int,
    shape: object,
    tile_ranges: TileRanges | None = None,
    tile_map: TileMapSummary | None = None,
    map_reserve: int = 0,
) -> OraclePlan:
    """Schedule and packed lists from checked host index tensors (int64, CPU); raises
    ``ValueError`` naming ``workspace_buffer`` when the lists alone do not fit."""
    q_lens = qo_indptr[1:] - qo_indptr[:-1]
    paged = kv_indices is not None and kv_last_page_len is not None
    kv_lens = _kv_lengths(kv_indptr, kv_last_page_len if paged else None, page_size)
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
        need = unsplit.total_bytes + 4 * ALIGN
        if map_reserve <= 0:
            raise ValueError(
                f"workspace_buffer: has {shape.workspace_bytes} bytes, the work lists need {need}"
            )
        raise ValueError(
            f"workspace_buffer: has {shape.workspace_bytes} bytes, of which the last "
            f"{map_reserve} are kept for the tile map (max_tile_map_bytes), and the work lists "
            f"need {need}: give a larger workspace or a smaller max_tile_map_bytes"
        )
    max_part_rows = free // (4 * (shape.head_dim + 1) + PART_ROW_RESERVE)
    cost = None
    if tile_map is not None:
        tile_ranges, cost = ranges_with_map(tile_map, tile_ranges), tile_map.visible_tokens
    sched = schedule_prefill(
        q_np, kv_np, shape.tile_q_tokens, shape.num_qo_heads, shape.num_kv_heads,
        shape.num_ctas, shape.kv_align, max_part_rows, tile_ranges, cost,
        walk_ctas=getattr(shape, "walk_ctas", 0),
    )  # fmt: skip
    layout = place_int32({**base, "items": sched.items.size, "merge_items": sched.merge_items.size})
    arrays = {
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_token_start": kv_token_starts(kv_lens),
        "items": torch.from_numpy(sched.items),
        "merge_items": torch.from_numpy(sched.merge_items),
    }
    if tile_map is not None:
        starts = map_starts(q_np, kv_np, shape.tile_q_tokens, tile_map.kv_block)
        arrays["tile_map_start"] = torch.from_numpy(starts)
    if paged:
        arrays["kv_indices"] = kv_indices  # type: ignore[assignment]
        arrays["kv_last_page_len"] = kv_last_page_len  # type: ignore[assignment]
    part_o = layout.total_bytes
    return OraclePlan(
        packed=pack_int32(layout, arrays).numpy(),
        layout=layout,
        schedule=sched,
        part_o_offset=part_o,
        part_lse_offset=part_o + aligned(4 * shape.head_dim * sched.part_rows),
    )


def pack_int32(
    layout: Int32Regions, arrays: Mapping[str, torch.Tensor | np.ndarray]
) -> torch.Tensor:
    """One CPU uint8 buffer of ``layout.total_bytes`` holding ``arrays`` at their offsets (the
    packing ``prefill_plan_write.h`` does in the host planner)."""
    buf = np.zeros(layout.total_bytes, dtype=np.uint8)
    words = buf.view(np.int32)
    for name, arr in arrays.items():
        data = arr.numpy() if isinstance(arr, torch.Tensor) else np.asarray(arr)
        start = layout.offsets[name] // 4
        words[start : start + data.size] = data.reshape(-1)
    return torch.from_numpy(buf)
