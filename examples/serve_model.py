"""Owns: the random-weight Llama-style model and the paged KV cache of ``examples/serve.py``.

The model is plain torch (embeddings, RMSNorm, rotary, grouped-query attention, SwiGLU MLP,
LM head) over a flat batch of tokens: ``forward(tokens, positions, slots, attend, rows)``
writes each token's K/V into its cache slot, then calls ``attend(layer, q, kv_cache)`` for
the attention, so one model serves chunked prefill, decode, CUDA graphs and every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelShape:
    """Sizes of the model (defaults: an 8-layer Llama-7B-shaped stack, 32/8 heads of 128)."""

    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 11008
    vocab: int = 32000
    max_positions: int = 8192
    rope_theta: float = 10000.0


class PagedKVCache:
    """One ``[pages, 2, page_size, H_kv, D]`` (NHD) tensor per layer and a free-page list.

    Page 0 is reserved as a scratch page: padding rows of a CUDA-graph batch write there.
    """

    SCRATCH_PAGE = 0

    def __init__(self, shape: ModelShape, num_pages: int, page_size: int, device, dtype):
        self.page_size = page_size
        self.num_pages = num_pages
        self.layers = [
            torch.zeros(num_pages, 2, page_size, shape.kv_heads, shape.head_dim, dtype=dtype,
                        device=device)
            for _ in range(shape.layers)
        ]  # fmt: skip
        self._free = list(range(num_pages - 1, self.SCRATCH_PAGE, -1))  # a stack, low ids first

    @property
    def free_pages(self) -> int:
        """Pages not held by any request."""
        return len(self._free)

    def pages_for(self, tokens: int) -> int:
        """Pages needed to hold ``tokens`` tokens."""
        return -(-tokens // self.page_size)

    def allocate(self, count: int) -> list[int]:
        """``count`` free page ids (ValueError when the pool is short)."""
        if count > len(self._free):
            raise ValueError(f"KV cache: {count} pages wanted, {len(self._free)} free")
        taken = self._free[-count:] if count else []
        del self._free[len(self._free) - count :]
        return taken[::-1]

    def release(self, pages: list[int]) -> None:
        """Give pages back to the pool."""
        self._free.extend(reversed(pages))


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


Attend = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


class TinyLlama:
    """Random-weight Llama-style decoder (seeded), bf16 weights on ``device``."""

    def __init__(self, shape: ModelShape, device, dtype=torch.bfloat16, seed: int = 0):
        self.shape = shape
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def weight(rows: int, cols: int, std: float = 0.02) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=g, device=device, dtype=torch.float32)
            return (w * std).to(dtype)

        ones = torch.ones(s.hidden, device=device, dtype=dtype)
        qkv_cols = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = weight(s.vocab, s.hidden, 1.0)
        self.layers = [
            _Layer(ones, weight(s.hidden, qkv_cols), weight(s.heads * s.head_dim, s.hidden),
                   ones, weight(s.hidden, 2 * s.intermediate), weight(s.intermediate, s.hidden))
            for _ in range(s.layers)
        ]  # fmt: skip
        self.final_norm = ones
        self.lm_head = weight(s.hidden, s.vocab)
        inv = 1.0 / s.rope_theta ** (
            torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim
        )
        angles = torch.arange(s.max_positions, device=device, dtype=torch.float32)[:, None] * inv
        self.cos, self.sin = angles.cos(), angles.sin()

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slot_pages: torch.Tensor,
        slot_offsets: torch.Tensor,
        cache: PagedKVCache,
        attend: Attend,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (float32) of a flat batch of ``T`` tokens.

        ``positions`` index the rotary table; token ``t``'s K/V go to page ``slot_pages[t]``,
        offset ``slot_offsets[t]``; ``rows`` selects the tokens whose logits are returned
        (all when None).
        """
        s = self.shape
        n = tokens.shape[0]
        h = self.embed[tokens]
        cos, sin = self.cos[positions], self.sin[positions]
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.attn_norm)
            qkv = (x @ layer.wqkv).view(n, s.heads + 2 * s.kv_heads, s.head_dim)
            q = _rotary(qkv[:, : s.heads], cos, sin)
            k = _rotary(qkv[:, s.heads : s.heads + s.kv_heads], cos, sin)
            kv = cache.layers[i]
            kv[slot_pages, 0, slot_offsets] = k
            kv[slot_pages, 1, slot_offsets] = qkv[:, s.heads + s.kv_heads :]
            o = attend(i, q.contiguous(), kv)
            h = h + o.reshape(n, -1) @ layer.wo
            gate, up = (_rms_norm(h, layer.mlp_norm) @ layer.w_gate_up).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ layer.w_down
        if rows is not None:
            h = h[rows]
        return (_rms_norm(h, self.final_norm) @ self.lm_head).float()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (Llama's rotate-half convention)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None], sin[:, None]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)
