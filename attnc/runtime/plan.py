"""The CPU side of the scheduler: request lengths, the work list, and the workspace layout.

A work item is one query tile (``tile_q_tokens`` tokens of one request, all query heads of a
KV head packed into the rows); items run heaviest (longest KV) first so long requests do not
finish last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WORKSPACE_ALIGN = 256


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


def work_list(
    q_lens: torch.Tensor, kv_lens: torch.Tensor, tile_q_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, query tile index) per work item, as int32 tensors.

    Request ``i`` gets ``ceil(q_lens[i] / tile_q_tokens)`` items; items are ordered by
    decreasing KV length, then request index, then tile index (deterministic).
    """
    if tile_q_tokens <= 0:
        raise ValueError(f"tile_q_tokens: must be positive, got {tile_q_tokens}")
    tiles = (q_lens + tile_q_tokens - 1) // tile_q_tokens
    order = sorted(range(q_lens.numel()), key=lambda i: (-int(kv_lens[i]), i))
    requests: list[int] = []
    q_tiles: list[int] = []
    for i in order:
        n = int(tiles[i])
        requests += [i] * n
        q_tiles += range(n)
    return torch.tensor(requests, dtype=torch.int32), torch.tensor(q_tiles, dtype=torch.int32)


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets of the int32 arrays ``plan()`` copies into the workspace."""

    offsets: dict[str, int]
    counts: dict[str, int]
    total_bytes: int


def workspace_layout(counts: dict[str, int]) -> WorkspaceLayout:
    """Place int32 arrays of the given element ``counts`` one after another, 256-byte aligned."""
    offsets: dict[str, int] = {}
    cursor = 0
    for name, count in counts.items():
        offsets[name] = cursor
        cursor += -(-count * 4 // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return WorkspaceLayout(offsets=offsets, counts=dict(counts), total_bytes=cursor)


def pack_int32(layout: WorkspaceLayout, arrays: dict[str, torch.Tensor]) -> torch.Tensor:
    """One CPU uint8 buffer of ``layout.total_bytes`` holding ``arrays`` at their offsets."""
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    for name, arr in arrays.items():
        data = arr.to(torch.int32).contiguous().view(torch.uint8)
        start = layout.offsets[name]
        buf[start : start + data.numel()] = data
    return buf


@dataclass(frozen=True)
class HostPlan:
    """Everything ``plan()`` decides on the CPU, before copying to the device."""

    qo_indptr: torch.Tensor  # CPU int64 [batch + 1]
    kv_indptr: torch.Tensor  # CPU int64 [batch + 1]
    q_lens: torch.Tensor
    kv_lens: torch.Tensor
    kv_indices: torch.Tensor | None  # CPU int64 [nnz pages], paged only
    kv_last_page_len: torch.Tensor | None  # CPU int64 [batch], paged only
    page_size: int
    tile_q_tokens: int
    work_request: torch.Tensor  # int32 [num_work]
    work_q_tile: torch.Tensor  # int32 [num_work]
    layout: WorkspaceLayout

    @property
    def batch_size(self) -> int:
        return self.qo_indptr.numel() - 1

    @property
    def num_work(self) -> int:
        return self.work_request.numel()

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
        """The CPU byte buffer to copy into the workspace."""
        arrays = {
            "qo_indptr": self.qo_indptr,
            "kv_indptr": self.kv_indptr,
            "work_request": self.work_request,
            "work_q_tile": self.work_q_tile,
        }
        if self.kv_indices is not None and self.kv_last_page_len is not None:
            arrays["kv_indices"] = self.kv_indices
            arrays["kv_last_page_len"] = self.kv_last_page_len
        return pack_int32(self.layout, arrays)


def make_host_plan(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    page_size: int,
    tile_q_tokens: int,
) -> HostPlan:
    """Work list and workspace layout from checked host index tensors (int64, CPU)."""
    q_lens = lengths(qo_indptr)
    if kv_indices is not None and kv_last_page_len is not None:
        kv_lens = kv_lengths_paged(kv_indptr, kv_last_page_len, page_size)
    else:
        kv_lens = lengths(kv_indptr)
    requests, q_tiles = work_list(q_lens, kv_lens, tile_q_tokens)
    counts = {
        "qo_indptr": qo_indptr.numel(),
        "kv_indptr": kv_indptr.numel(),
        "work_request": requests.numel(),
        "work_q_tile": q_tiles.numel(),
    }
    if kv_indices is not None and kv_last_page_len is not None:
        counts["kv_indices"] = kv_indices.numel()
        counts["kv_last_page_len"] = kv_last_page_len.numel()
    return HostPlan(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len,
        page_size=page_size,
        tile_q_tokens=tile_q_tokens,
        work_request=requests,
        work_q_tile=q_tiles,
        layout=workspace_layout(counts),
    )
