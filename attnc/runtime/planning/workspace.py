"""Owns: where plan-time data sits in a wrapper's device workspace.

Two layouts, both of 256-byte aligned regions: ``WorkspaceLayout``, the decode workspace fixed
for a wrapper's lifetime (the work region the planner writes -- header, per-CTA index,
per-request arrays, merge list, items last -- then the page ids, the requests' first flattened
KV tokens and the fp32 partial states of split requests), and ``Int32Regions``, the int32 lists of
one prefill plan, placed one after another (``place_int32``; the host planner packs them into
one buffer). The decode work-region constants mirror ``decode_args.h`` (``AttncDecodeHeader``,
item and merge rows).
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 256

# The decode work region (decode_args.h).
HEADER_INTS = 16
ITEM_INTS = 8
MERGE_INTS = 4


class CapacityError(ValueError):
    """The batch needs more than the wrapper's fixed capacity."""


def aligned(n: int) -> int:
    """``n`` rounded up to the region alignment."""
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
    kv_token_start: int  # int32 [max_batch + 1]: first flattened KV token per request
    partials: int
    total_bytes: int

    @property
    def partial_bytes(self) -> int:
        """Bytes left for the fp32 partial states."""
        return self.total_bytes - self.partials

    def work_bytes(self, num_items: int) -> int:
        """Bytes of the work region that hold data for ``num_items`` items."""
        return self.items + num_items * ITEM_INTS * 4

    def max_part_rows(self, head_dim: int) -> int:
        """fp32 partial rows (O ``[rows, head_dim]`` then LSE ``[rows]``) that fit."""
        return max(0, (self.partial_bytes - ALIGN) // (4 * (head_dim + 1)))

    def part_lse_offset(self, head_dim: int) -> int:
        """Byte offset of the partial LSE rows for ``head_dim``."""
        return self.partials + aligned(self.max_part_rows(head_dim) * head_dim * 4)


def make_layout(
    workspace_bytes: int, max_batch: int, max_items: int, max_ctas: int, max_pages: int | None
) -> WorkspaceLayout:
    """Place the decode regions; by default page ids get a quarter of what the work region
    leaves."""
    if max_batch <= 0 or max_items <= 0 or max_ctas <= 0:
        raise ValueError("decode capacity: max_batch, max_items and max_ctas must be positive")
    header = 0
    cta_indptr = header + aligned(HEADER_INTS * 4)
    req_page_begin = cta_indptr + aligned((max_ctas + 1) * 4)
    req_kv_len = req_page_begin + aligned(max_batch * 4)
    merge_items = req_kv_len + aligned(max_batch * 4)
    items = merge_items + aligned(max_batch * MERGE_INTS * 4)
    page_ids = items + aligned(max_items * ITEM_INTS * 4)
    rest = workspace_bytes - page_ids
    if rest <= 2 * ALIGN:
        raise CapacityError(
            f"workspace_buffer: {workspace_bytes} bytes is too small; the work lists alone "
            f"need {page_ids + 2 * ALIGN} (max_batch_size={max_batch})"
        )
    if max_pages is None:
        max_pages = rest // 4 // 4
    kv_token_start = page_ids + aligned(max_pages * 4)
    partials = kv_token_start + aligned((max_batch + 1) * 4)
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
        kv_token_start=kv_token_start,
        partials=partials,
        total_bytes=workspace_bytes,
    )


@dataclass(frozen=True)
class Int32Regions:
    """Byte offsets of the int32 arrays a prefill ``plan()`` copies into the workspace."""

    offsets: dict[str, int]
    counts: dict[str, int]
    total_bytes: int


def place_int32(counts: dict[str, int]) -> Int32Regions:
    """Place int32 arrays of the given element ``counts`` one after another, aligned."""
    offsets: dict[str, int] = {}
    cursor = 0
    for name, count in counts.items():
        offsets[name] = cursor
        cursor += aligned(count * 4)
    return Int32Regions(offsets=offsets, counts=dict(counts), total_bytes=cursor)
