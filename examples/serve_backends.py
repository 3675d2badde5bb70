"""Owns: the attention backends of ``examples/serve.py`` behind one small interface.

Each backend is planned once per step (``plan_prefill`` for the step's prefill chunks,
``plan_decode`` for a decode batch of a CUDA-graph bucket) and then run for every layer
(``prefill`` / ``decode``). ``AttncBackend`` uses ``attnc.BatchPrefillWrapper`` and one
``attnc.BatchDecodeWrapper(use_cuda_graph=True)`` per bucket; ``FlashInferBackend`` the
matching FlashInfer wrappers; ``TorchBackend`` is plain float32 torch attention over the
gathered pages (the correctness baseline of ``--tiny``; no CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WORKSPACE_BYTES = 256 << 20


@dataclass(frozen=True)
class PageTable:
    """A batch over the paged cache, as CPU int32 tensors (FlashInfer's layout)."""

    qo_indptr: torch.Tensor  # [batch + 1] query tokens per request (prefill)
    kv_indptr: torch.Tensor  # [batch + 1] pages per request
    kv_indices: torch.Tensor  # page ids, request after request
    kv_last_page_len: torch.Tensor  # [batch] tokens in each request's last page


@dataclass(frozen=True)
class Heads:
    """Attention shape shared by every backend."""

    qo: int
    kv: int
    dim: int
    page_size: int
    max_pages: int


class AttncBackend:
    """attnc's causal variant through its batch wrappers."""

    name = "attnc"
    graphs = True

    def __init__(self, heads: Heads, device: torch.device):
        import attnc

        self._attnc = attnc
        self.heads = heads
        self.device = device
        self.variant = attnc.load("stdlib:causal")
        self._prefill = attnc.BatchPrefillWrapper(self.variant, _workspace(device), "NHD")
        self._decode: dict[int, object] = {}

    def plan_prefill(self, table: PageTable) -> None:
        """Plan the step's prefill chunks (all layers reuse it)."""
        h = self.heads
        self._prefill.plan(
            table.qo_indptr, table.kv_indptr, h.qo, h.kv, h.dim,
            kv_indices=table.kv_indices, kv_last_page_len=table.kv_last_page_len,
            page_size=h.page_size, dtype=torch.bfloat16,
        )  # fmt: skip

    def prefill(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """One layer of the planned prefill."""
        return self._prefill.run(q, kv)

    def plan_decode(self, bucket: int, table: PageTable) -> None:
        """Plan a decode step of ``bucket`` requests (padding included)."""
        wrapper = self._decode.get(bucket)
        if wrapper is None:
            wrapper = self._attnc.BatchDecodeWrapper(
                self.variant, _workspace(self.device), "NHD", use_cuda_graph=True,
                max_batch_size=bucket, max_num_pages=self.heads.max_pages,
            )  # fmt: skip
            self._decode[bucket] = wrapper
        h = self.heads
        wrapper.plan(  # type: ignore[attr-defined]
            table.kv_indptr, table.kv_indices, table.kv_last_page_len,
            h.qo, h.kv, h.dim, h.page_size, dtype=torch.bfloat16,
        )  # fmt: skip

    def decode(self, bucket: int, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """One layer of the planned decode step (capturable)."""
        return self._decode[bucket].run(q, kv)  # type: ignore[attr-defined]


class FlashInferBackend:
    """FlashInfer's paged prefill and decode wrappers, the side-by-side baseline."""

    name = "flashinfer"
    graphs = True

    def __init__(self, heads: Heads, device: torch.device):
        import flashinfer

        self._fi = flashinfer
        self.heads = heads
        self.device = device
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), "NHD")
        self._decode: dict[int, object] = {}

    def plan_prefill(self, table: PageTable) -> None:
        """Plan the step's prefill chunks (causal, queries aligned to the end of the KV)."""
        h = self.heads
        self._prefill.plan(
            table.qo_indptr, table.kv_indptr, table.kv_indices, table.kv_last_page_len,
            h.qo, h.kv, h.dim, h.page_size, causal=True,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )  # fmt: skip

    def prefill(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """One layer of the planned prefill."""
        return self._prefill.run(q, kv)

    def plan_decode(self, bucket: int, table: PageTable) -> None:
        """Plan a decode step of ``bucket`` requests into the bucket's fixed buffers."""
        wrapper = self._decode.get(bucket)
        if wrapper is None:
            d = self.device
            wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(d), "NHD", use_cuda_graph=True,
                use_tensor_cores=self.heads.qo // self.heads.kv >= 4,
                paged_kv_indptr_buffer=torch.zeros(bucket + 1, dtype=torch.int32, device=d),
                paged_kv_indices_buffer=torch.zeros(
                    self.heads.max_pages, dtype=torch.int32, device=d),
                paged_kv_last_page_len_buffer=torch.zeros(bucket, dtype=torch.int32, device=d),
            )  # fmt: skip
            self._decode[bucket] = wrapper
        h = self.heads
        wrapper.plan(  # type: ignore[attr-defined]
            table.kv_indptr, table.kv_indices, table.kv_last_page_len,
            h.qo, h.kv, h.dim, h.page_size,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )  # fmt: skip

    def decode(self, bucket: int, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """One layer of the planned decode step (capturable)."""
        return self._decode[bucket].run(q, kv)  # type: ignore[attr-defined]


class TorchBackend:
    """Float32 torch attention over the gathered pages, request by request."""

    name = "torch"
    graphs = False

    def __init__(self, heads: Heads, device: torch.device):
        self.heads = heads
        self._table: PageTable | None = None

    def plan_prefill(self, table: PageTable) -> None:
        """Remember the page table."""
        self._table = table

    def prefill(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Causal attention of each request's query rows over its pages."""
        assert self._table is not None
        t = self._table
        qo, kvp = t.qo_indptr.tolist(), t.kv_indptr.tolist()
        pages, last = t.kv_indices.tolist(), t.kv_last_page_len.tolist()
        out = torch.empty_like(q)
        for b in range(len(qo) - 1):
            ids = pages[kvp[b] : kvp[b + 1]]
            kv_len = (len(ids) - 1) * self.heads.page_size + last[b]
            k = kv[ids, 0].flatten(0, 1)[:kv_len]
            v = kv[ids, 1].flatten(0, 1)[:kv_len]
            out[qo[b] : qo[b + 1]] = torch_attention(q[qo[b] : qo[b + 1]], k, v)
        return out

    def plan_decode(self, bucket: int, table: PageTable) -> None:
        """Remember the page table (one query row per request)."""
        n = table.kv_last_page_len.numel()
        self._table = PageTable(
            torch.arange(n + 1, dtype=torch.int32), table.kv_indptr, table.kv_indices,
            table.kv_last_page_len,
        )  # fmt: skip

    def decode(self, bucket: int, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Like ``prefill`` with one query per request."""
        return self.prefill(layer, q, kv)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention in float32, queries aligned to the end of the keys, GQA."""
    group = q.shape[1] // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf) / q.shape[-1] ** 0.5
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + (k.shape[0] - q.shape[0])
    s = s.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), vf).to(q.dtype)


def make_backend(name: str, heads: Heads, device: torch.device):
    """The backend called ``name`` (attnc, flashinfer or torch)."""
    kinds = {"attnc": AttncBackend, "flashinfer": FlashInferBackend, "torch": TorchBackend}
    return kinds[name](heads, device)


def _workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
