"""The CPU side of the decode scheduler: split-KV chunking, work lists and workspace layout.

``schedule()`` runs once per batch step (reused by every layer). A work item is
(request, KV head, row block, KV chunk ``[begin, end)``) with cost ``alpha * l_q + beta * l_kv``.
The chunk size is chosen from the total cost and the fixed number of CTAs so that every CTA
gets about the same work; only requests longer than the chunk are split. Items are sorted by
decreasing cost (stable, so the same lengths always give the same plan) and cut into
contiguous runs of about equal cost, one run per CTA (the heaviest items start first).

The device workspace has a fixed layout for the wrapper's lifetime (``WorkspaceLayout``):
the work region (header, per-CTA index, per-request arrays, merge list, items last) is
written into a pinned host buffer and copied with one copy; page ids and the fp32 partial
states of split requests follow at fixed offsets. Kernels read their counts from the header,
so a CUDA graph captured once replays correctly after a new plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHA = 16.0  # cost of one query token of an item, in KV tokens
BETA = 1.0  # cost of one KV token
MIN_CHUNK = 256  # never split a request into chunks shorter than this
SPLIT_FACTOR = 4  # chunk ~ (cost per CTA) / SPLIT_FACTOR: CTA loads within ~1/4 of each other

HEADER_INTS = 16
ITEM_INTS = 8
MERGE_INTS = 4
ALIGN = 256

# Header fields (decode_args.h: AttncDecodeHeader).
H_NUM_ITEMS, H_Q_LEN, H_BATCH, H_MERGE_ROWS, H_NUM_MERGE = 0, 1, 2, 3, 4


class CapacityError(ValueError):
    """The batch needs more than the wrapper's fixed capacity."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets of the decode workspace regions (fixed for a wrapper)."""

    max_batch: int
    max_items: int
    max_ctas: int
    max_pages: int
    header: int
    cta_indptr: int
    req_page_begin: int
    req_kv_len: int
    merge_items: int
    items: int
    page_ids: int
    partials: int
    total_bytes: int

    @property
    def partial_bytes(self) -> int:
        return self.total_bytes - self.partials

    def work_bytes(self, num_items: int) -> int:
        """Bytes of the work region that hold data for ``num_items`` items."""
        return self.items + num_items * ITEM_INTS * 4

    def max_part_rows(self, head_dim: int) -> int:
        """fp32 partial rows (O ``[rows, head_dim]`` then LSE ``[rows]``) that fit."""
        return max(0, (self.partial_bytes - ALIGN) // (4 * (head_dim + 1)))

    def part_lse_offset(self, head_dim: int) -> int:
        return self.partials + _align(self.max_part_rows(head_dim) * head_dim * 4)


def make_layout(
    workspace_bytes: int, max_batch: int, max_items: int, max_ctas: int, max_pages: int | None
) -> WorkspaceLayout:
    """Place the regions; by default page ids get a quarter of what the work region leaves."""
    if max_batch <= 0 or max_items <= 0 or max_ctas <= 0:
        raise ValueError("decode capacity: max_batch, max_items and max_ctas must be positive")
    header = 0
    cta_indptr = header + _align(HEADER_INTS * 4)
    req_page_begin = cta_indptr + _align((max_ctas + 1) * 4)
    req_kv_len = req_page_begin + _align(max_batch * 4)
    merge_items = req_kv_len + _align(max_batch * 4)
    items = merge_items + _align(max_batch * MERGE_INTS * 4)
    page_ids = items + _align(max_items * ITEM_INTS * 4)
    rest = workspace_bytes - page_ids
    if rest <= 2 * ALIGN:
        raise CapacityError(
            f"workspace_buffer: {workspace_bytes} bytes is too small; the work lists alone "
            f"need {page_ids + 2 * ALIGN} (max_batch_size={max_batch})"
        )
    if max_pages is None:
        max_pages = rest // 4 // 4
    partials = page_ids + _align(max_pages * 4)
    if partials + ALIGN > workspace_bytes:
        raise CapacityError(
            f"workspace_buffer: {workspace_bytes} bytes cannot hold {max_pages} page ids"
        )
    return WorkspaceLayout(
        max_batch=max_batch,
        max_items=max_items,
        max_ctas=max_ctas,
        max_pages=max_pages,
        header=header,
        cta_indptr=cta_indptr,
        req_page_begin=req_page_begin,
        req_kv_len=req_kv_len,
        merge_items=merge_items,
        items=items,
        page_ids=page_ids,
        partials=partials,
        total_bytes=workspace_bytes,
    )


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
) -> int:
    """KV tokens per chunk: a fraction of the cost per CTA, tile-aligned, >= ``min_chunk``."""
    item_q = alpha * q_len
    total = units * float(item_q * kv.shape[0] + beta * int(kv.sum()))
    per_cta = total / max(num_ctas, 1)
    chunk = max(min_chunk, int((per_cta - item_q) / beta / SPLIT_FACTOR))
    return -(-chunk // kv_tile) * kv_tile


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
) -> Schedule:
    """Split and order the work of one decode step (see the module doc).

    ``kv_lens`` int64 ``[batch]``; ``row_blocks`` work items per (request, KV head, chunk)
    along the packed query rows; ``max_part_rows`` bounds the partial states (requests are
    split less when they would not fit). Raises ``CapacityError`` past ``max_items``.
    """
    kv = np.asarray(kv_lens, dtype=np.int64)
    batch = kv.shape[0]
    units = num_kv_heads * row_blocks
    item_q = alpha * q_len
    slot_rows = q_len * num_qo_heads
    if min_chunk is None:
        min_chunk = MIN_CHUNK
    chunk = choose_chunk(kv, q_len, units, num_ctas, kv_tile, alpha, beta, min_chunk)
    split_any = batch > 0 and int(kv.max()) > chunk
    while split_any:
        n, size = _chunk_counts(kv, chunk, kv_tile)
        split = n > 1
        slots = int(n[split].sum())
        if slots * slot_rows <= max_part_rows or slots == 0:
            split_any = slots > 0
            break
        chunk *= 2
        split_any = int(kv.max()) > chunk

    if split_any:
        # Chunks: (request, chunk index j, begin, end, partial slot).
        total_chunks = int(n.sum())
        req = np.repeat(np.arange(batch, dtype=np.int64), n)
        first = np.cumsum(n) - n
        j = np.arange(total_chunks, dtype=np.int64) - first[req]
        begin = j * size[req]
        end = np.minimum(begin + size[req], kv[req])
        sn = np.where(split, n, 0)
        part_base = np.cumsum(sn) - sn
        part = np.where(split[req], part_base[req] + j, -1)
        split_req = np.flatnonzero(split)
    else:
        chunk, slots, total_chunks = 0, 0, batch
        req = np.arange(batch, dtype=np.int64)
        begin = np.zeros(batch, dtype=np.int64)
        end = kv
        part = np.full(batch, -1, dtype=np.int64)
        n = np.ones(batch, dtype=np.int64)
        split_req = np.zeros(0, dtype=np.int64)
        part_base = n

    num_items = total_chunks * units
    if max_items is not None and num_items > max_items:
        raise CapacityError(
            f"decode plan: needs {num_items} work items, the wrapper holds {max_items} "
            f"(raise max_batch_size or pass a larger max_work_items)"
        )
    # Heaviest chunks first (stable: ties keep request order); each chunk expands to its
    # KV heads x row blocks, all of the same cost.
    length = end - begin
    order = np.argsort(-length, kind="stable")
    items3 = np.zeros((total_chunks, units, ITEM_INTS), dtype=np.int32)
    items3[:, :, 0] = req[order, None]
    items3[:, :, 1] = np.arange(units) // row_blocks
    items3[:, :, 2] = np.arange(units) % row_blocks
    items3[:, :, 3] = begin[order, None]
    items3[:, :, 4] = end[order, None]
    items3[:, :, 5] = part[order, None]
    items = items3.reshape(num_items, ITEM_INTS)
    cost_items = np.repeat(item_q + beta * length[order], units)

    # Contiguous runs of ~equal cost: an item goes to the CTA its cost midpoint falls in.
    if num_items:
        prefix = np.cumsum(cost_items)
        mid = prefix - 0.5 * cost_items
        cta = np.minimum(num_ctas - 1, (mid * (num_ctas / prefix[-1])).astype(np.int64))
        cta_indptr = np.searchsorted(cta, np.arange(num_ctas + 1))
        cta_indptr[-1] = num_items
    else:
        cta_indptr = np.zeros(num_ctas + 1, dtype=np.int64)

    merge = np.zeros((split_req.shape[0], MERGE_INTS), dtype=np.int32)
    if split_req.shape[0]:
        merge[:, 0] = split_req
        merge[:, 1] = n[split_req]
        merge[:, 2] = part_base[split_req]
    return Schedule(
        items=items,
        cta_indptr=cta_indptr.astype(np.int32),
        merge_items=merge,
        num_chunks=n,
        chunk_size=int(chunk),
        num_part_slots=slots if split_any else 0,
        merge_rows=int(split_req.shape[0]) * slot_rows,
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
