"""The oracle of the decode planner: the numpy scheduler the C++ planner
(attnc/kernels/host/) is checked against, bit for bit (tests/codegen/test_native_plan.py,
test_decode_plan_step.py, test_decode_scheduler.py). Not used by the runtime.

``schedule()`` plans one decode step. A work item is (request, KV head, row block, KV chunk
``[begin, end)``) with cost ``alpha * l_q + beta * l_kv`` (plus a fixed per-item overhead in
the balance model). Requests longer than a chunk are split; the chunk size is chosen among "no
split" and the cost per CTA divided by each split factor (``decode_plan.SPLIT_FACTORS``), by
the predicted step time: items go heaviest first to the least-loaded CTA (longest processing
time first, lowest CTA index on ties), and the busiest CTA plus the merge (when anything is
split) is the prediction.
``write_work_region`` writes what the kernels read into a host buffer laid out by
``attnc.runtime.planning.workspace.WorkspaceLayout``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from attnc.runtime.checks import page_table
from attnc.runtime.planning import decode_plan
from attnc.runtime.planning.decode_plan import ALPHA, BETA, MIN_CHUNK
from attnc.runtime.planning.workspace import (
    HEADER_INTS,
    ITEM_INTS,
    MERGE_INTS,
    CapacityError,
    WorkspaceLayout,
)

ITEM_OVERHEAD = 128.0  # fixed cost of one work item, in KV tokens (H200: ~5 us per CTA)
MERGE_OVERHEAD = 256.0  # the merge kernel's share of the step, in KV tokens
# Header entries of the decode work region (decode_args.h: ATTNC_DH_*).
H_NUM_ITEMS, H_Q_LEN, H_BATCH, H_MERGE_ROWS, H_NUM_MERGE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Schedule:
    """One plan: items in CTA order and everything the kernels read from the header."""

    items: np.ndarray  # int32 [num_items, ITEM_INTS]
    cta_indptr: np.ndarray  # int32 [num_ctas + 1]
    merge_items: np.ndarray  # int32 [num_split, MERGE_INTS]
    num_chunks: np.ndarray  # int64 [batch]: KV chunks per request (1 = not split)
    chunk_size: int  # KV tokens per chunk; 0 when no request is split
    num_part_slots: int  # partial slots used (one per chunk of a split request)
    merge_rows: int
    cost: np.ndarray  # float64 [num_items]: cost of each item (CTA order)

    @property
    def num_items(self) -> int:
        return int(self.items.shape[0])

    def cta_loads(self) -> np.ndarray:
        """Total cost per CTA."""
        sums = np.concatenate([[0.0], np.cumsum(self.cost)])
        return sums[self.cta_indptr[1:]] - sums[self.cta_indptr[:-1]]


def _chunk_counts(kv: np.ndarray, chunk: int, kv_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks per request and the (tile-aligned) chunk length of each request."""
    n = np.maximum(1, -(-kv // chunk))
    size = -(-kv // n)
    size = np.maximum(kv_tile, -(-size // kv_tile) * kv_tile)
    return np.maximum(1, -(-kv // size)), size


def choose_chunk(
    kv: np.ndarray,
    q_len: int,
    units: int,
    num_ctas: int,
    kv_tile: int,
    alpha: float = ALPHA,
    beta: float = BETA,
    min_chunk: int = MIN_CHUNK,
    split_factor: int = 1,
) -> int:
    """KV tokens per chunk: the cost per CTA / ``split_factor``, tile-aligned, >= ``min_chunk``."""
    item_q = alpha * q_len
    total = units * float(item_q * kv.shape[0] + beta * int(kv.sum()))
    per_cta = total / max(num_ctas, 1)
    chunk = max(min_chunk, int((per_cta - item_q) / beta / split_factor))
    return -(-chunk // kv_tile) * kv_tile


@dataclass(frozen=True)
class _Split:
    """Chunks of every request for one chunk size (before ordering and assignment)."""

    chunk: int  # 0: nothing split
    req: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    part: np.ndarray
    num_chunks: np.ndarray
    part_base: np.ndarray
    split_req: np.ndarray
    slots: int


def _split(kv: np.ndarray, chunk: int, kv_tile: int, slot_rows: int, max_part_rows: int) -> _Split:
    """Cut requests longer than ``chunk`` (doubling it while the partial states would not fit
    ``max_part_rows``); ``chunk <= 0`` splits nothing."""
    batch = kv.shape[0]
    split_any = chunk > 0 and batch > 0 and int(kv.max()) > chunk
    while split_any:
        n, size = _chunk_counts(kv, chunk, kv_tile)
        split = n > 1
        slots = int(n[split].sum())
        if slots * slot_rows <= max_part_rows or slots == 0:
            split_any = slots > 0
            break
        chunk *= 2
        split_any = int(kv.max()) > chunk
    if not split_any:
        ones = np.ones(batch, dtype=np.int64)
        return _Split(
            0, np.arange(batch, dtype=np.int64), np.zeros(batch, dtype=np.int64), kv,
            np.full(batch, -1, dtype=np.int64), ones, ones, np.zeros(0, dtype=np.int64), 0,
        )  # fmt: skip
    total_chunks = int(n.sum())
    req = np.repeat(np.arange(batch, dtype=np.int64), n)
    first = np.cumsum(n) - n
    j = np.arange(total_chunks, dtype=np.int64) - first[req]
    begin = j * size[req]
    end = np.minimum(begin + size[req], kv[req])
    sn = np.where(split, n, 0)
    part_base = np.cumsum(sn) - sn
    part = np.where(split[req], part_base[req] + j, -1)
    return _Split(
        chunk, req, begin, end, part, n, part_base, np.flatnonzero(split), slots
    )  # fmt: skip


def assign_lpt(cost: np.ndarray, num_ctas: int) -> np.ndarray:
    """CTA of each item (``cost`` sorted heaviest first): each goes to the CTA with the least
    work so far, the lowest index on ties (longest processing time first, deterministic)."""
    heap = [(0.0, b) for b in range(num_ctas)]
    cta = np.empty(cost.shape[0], dtype=np.int64)
    for i, c in enumerate(cost.tolist()):
        load, b = heap[0]
        heapq.heapreplace(heap, (load + c, b))
        cta[i] = b
    return cta


def _makespan(cost: np.ndarray, cta: np.ndarray, num_ctas: int, split: bool) -> float:
    """Predicted step time in KV tokens: the busiest CTA, plus the merge when anything is
    split."""
    loads = np.bincount(cta, weights=cost, minlength=num_ctas)
    return float(loads.max(initial=0.0)) + (MERGE_OVERHEAD if split else 0.0)


def _lower_bound(sp: _Split, units: int, item_q: float, beta: float, num_ctas: int) -> float:
    """No assignment of ``sp``'s items beats its average CTA load or its longest item (plus
    the merge)."""
    base = item_q + ITEM_OVERHEAD
    length = sp.end - sp.begin
    tokens = int(length.sum())
    total = float(sp.req.shape[0] * units) * base + float(units) * beta * float(tokens)
    longest = base + beta * float(length.max(initial=0))
    return max(total / float(num_ctas), longest) + (MERGE_OVERHEAD if sp.chunk > 0 else 0.0)


def schedule(
    kv_lens: np.ndarray,
    q_len: int,
    num_qo_heads: int,
    num_kv_heads: int,
    row_blocks: int,
    num_ctas: int,
    kv_tile: int,
    max_part_rows: int,
    *,
    alpha: float = ALPHA,
    beta: float = BETA,
    min_chunk: int | None = None,
    max_items: int | None = None,
    spans: tuple[np.ndarray, np.ndarray] | None = None,
    split_factors: tuple[int, ...] | None = None,
) -> Schedule:
    """Split, order and assign the work of one decode step (see the module doc).

    ``kv_lens`` int64 ``[batch]``; ``row_blocks`` work items per (request, KV head, chunk)
    along the packed query rows; ``max_part_rows`` bounds the partial states (requests are
    split less when they would not fit). ``spans``, when given, is the (offset, length) of the
    KV each request's queries may see under the mask (``mask_ranges_oracle.decode_spans``):
    only that range is chunked and costed. Raises ``CapacityError`` past ``max_items``.
    """
    kv = np.asarray(kv_lens, dtype=np.int64)
    offset = np.zeros_like(kv)
    if spans is not None:
        offset, kv = (np.asarray(x, dtype=np.int64) for x in spans)
    units = num_kv_heads * row_blocks
    item_q = alpha * q_len
    slot_rows = q_len * num_qo_heads
    if min_chunk is None:
        min_chunk = MIN_CHUNK
    num_ctas = max(num_ctas, 1)

    best: tuple[float, _Split, np.ndarray, np.ndarray] | None = None
    fewest = None
    tried: set[int] = set()
    candidates = [0] + [
        choose_chunk(kv, q_len, units, num_ctas, kv_tile, alpha, beta, min_chunk, f)
        for f in (decode_plan.SPLIT_FACTORS if split_factors is None else split_factors)
    ]
    for chunk in candidates:
        sp = _split(kv, chunk, kv_tile, slot_rows, max_part_rows)
        if sp.chunk in tried:
            continue
        tried.add(sp.chunk)
        num_items = sp.req.shape[0] * units
        fewest = num_items if fewest is None else min(fewest, num_items)
        if max_items is not None and num_items > max_items:
            continue
        if best is not None and _lower_bound(sp, units, item_q, beta, num_ctas) > best[0] * (
            1.0 + 1e-9
        ):
            continue  # cannot win: skip the assignment
        length = sp.end - sp.begin
        order = np.argsort(-length, kind="stable")
        cost = np.repeat(item_q + ITEM_OVERHEAD + beta * length[order], units)
        cta = assign_lpt(cost, num_ctas)
        time = _makespan(cost, cta, num_ctas, sp.chunk > 0)
        if best is None or time < best[0]:
            best = (time, sp, order, cta)
    if best is None:
        raise CapacityError(
            f"decode plan: needs {fewest} work items, the wrapper holds {max_items} "
            f"(raise max_batch_size or pass a larger max_work_items)"
        )
    _, sp, order, cta = best
    total_chunks = sp.req.shape[0]
    num_items = total_chunks * units
    # Each chunk expands to its KV heads x row blocks (same cost), then items are grouped by
    # CTA (stable: a CTA runs its items heaviest first).
    items3 = np.zeros((total_chunks, units, ITEM_INTS), dtype=np.int32)
    items3[:, :, 0] = sp.req[order, None]
    items3[:, :, 1] = np.arange(units) // row_blocks
    items3[:, :, 2] = np.arange(units) % row_blocks
    items3[:, :, 3] = (sp.begin + offset[sp.req])[order, None]
    items3[:, :, 4] = (sp.end + offset[sp.req])[order, None]
    items3[:, :, 5] = sp.part[order, None]
    by_cta = np.argsort(cta, kind="stable")
    items = items3.reshape(num_items, ITEM_INTS)[by_cta]
    length = (sp.end - sp.begin)[order]
    cost_items = np.repeat(item_q + beta * length, units)[by_cta]
    cta_indptr = np.concatenate([[0], np.cumsum(np.bincount(cta, minlength=num_ctas))])

    merge = np.zeros((sp.split_req.shape[0], MERGE_INTS), dtype=np.int32)
    if sp.split_req.shape[0]:
        merge[:, 0] = sp.split_req
        merge[:, 1] = sp.num_chunks[sp.split_req]
        merge[:, 2] = sp.part_base[sp.split_req]
    return Schedule(
        items=items,
        cta_indptr=cta_indptr.astype(np.int32),
        merge_items=merge,
        num_chunks=sp.num_chunks,
        chunk_size=int(sp.chunk),
        num_part_slots=sp.slots,
        merge_rows=int(sp.split_req.shape[0]) * slot_rows,
        cost=cost_items,
    )


def write_work_region(
    buf: np.ndarray,
    layout: WorkspaceLayout,
    sched: Schedule,
    q_len: int,
    req_page_begin: np.ndarray,
    kv_lens: np.ndarray,
) -> int:
    """Write the work region into the uint8 host buffer ``buf``; return the bytes to copy."""
    batch = kv_lens.shape[0]
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[H_NUM_ITEMS] = sched.num_items
    header[H_Q_LEN] = q_len
    header[H_BATCH] = batch
    header[H_MERGE_ROWS] = sched.merge_rows
    header[H_NUM_MERGE] = sched.merge_items.shape[0]
    _put(buf, layout.header, header)
    _put(buf, layout.cta_indptr, sched.cta_indptr)
    _put(buf, layout.req_page_begin, req_page_begin)
    _put(buf, layout.req_kv_len, kv_lens)
    _put(buf, layout.merge_items, sched.merge_items)
    _put(buf, layout.items, sched.items)
    return layout.work_bytes(sched.num_items)


def _put(buf: np.ndarray, offset: int, arr: np.ndarray) -> None:
    data = np.ascontiguousarray(arr, dtype=np.int32).reshape(-1).view(np.uint8)
    buf[offset : offset + data.shape[0]] = data


def check_page_table(
    indptr: np.ndarray, last: np.ndarray, page_size: int, layout: WorkspaceLayout,
    ids: np.ndarray, ids_on_device: bool,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """The page-table checks of the planner step, in its order, on int32 host arrays: the KV
    length per request and the largest host page id (-1: none or on the device); raises
    the error the wrapper raises (worded by ``checks/page_table.py``)."""
    if indptr.shape[0] == 0:
        raise page_table.indptr_empty()
    if indptr[0] != 0:
        raise page_table.indptr_start(int(indptr[0]))
    pages = np.diff(indptr.astype(np.int64))
    if pages.shape[0] and int(pages.min()) < 0:
        i = int(np.argmax(pages < 0)) + 1
        raise page_table.indptr_decreasing(i, int(indptr[i]), int(indptr[i - 1]))
    batch = indptr.shape[0] - 1
    if last.shape[0] != batch:
        raise page_table.wrong_count("kv_last_page_len", batch, last.shape[0])
    bad = (pages > 0) & ((last < 1) | (last > page_size))
    if bad.any():
        i = int(np.argmax(bad))
        raise page_table.last_range(i, int(last[i]), page_size)
    if batch > layout.max_batch:
        raise page_table.batch_capacity(batch, layout.max_batch)
    nnz = int(indptr[-1])
    if nnz > layout.max_pages:
        raise page_table.page_capacity(nnz, layout.max_pages)
    if ids.shape[0] < nnz:
        raise page_table.indices_short(ids.shape[0], nnz)
    max_page = -1
    if nnz and not ids_on_device:
        if int(ids[:nnz].min()) < 0:
            raise page_table.index_negative(int(ids[:nnz].min()))
        max_page = int(ids[:nnz].max())
    kv_lens = np.where(pages > 0, (pages - 1) * page_size + last.astype(np.int64), 0)
    return kv_lens, max_page
