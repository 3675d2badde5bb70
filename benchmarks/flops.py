"""Work counts: FLOPs over unmasked (q, kv) pairs, and bytes of K and V read by decode."""

from __future__ import annotations

from collections.abc import Iterable

from benchmarks.workloads import Mask


def visible_keys(mask: Mask, q_pos: int, kv_len: int) -> int:
    """Number of kv indices in [0, kv_len) that query position ``q_pos`` may attend to."""
    causal = max(0, min(q_pos + 1, kv_len))
    if mask.kind == "none":
        return kv_len
    if mask.kind == "causal":
        return causal
    if mask.kind == "window":
        lo = max(0, q_pos - mask.window + 1)
        hi = min(q_pos, kv_len - 1)
        return max(0, hi - lo + 1)
    if mask.kind == "prefix":
        return max(causal, min(mask.prefix, kv_len))
    raise ValueError(f"unknown mask kind {mask.kind!r}")


def pair_count(mask: Mask, q_len: int, kv_len: int) -> int:
    """Unmasked pairs of one request; q_pos = q_idx + kv_len - q_len (bottom-right)."""
    offset = kv_len - q_len
    return sum(visible_keys(mask, q_idx + offset, kv_len) for q_idx in range(q_len))


def prefill_flops(mask: Mask, q_len: int, kv_len: int, num_qo_heads: int, head_dim: int) -> int:
    """FLOPs of one request: 2 for Q.K^T plus 2 for P.V per pair, head dim and head."""
    return 4 * pair_count(mask, q_len, kv_len) * num_qo_heads * head_dim


def batch_prefill_flops(mask: Mask, lens: Iterable[int], num_qo_heads: int, head_dim: int) -> int:
    """FLOPs of a ragged batch with q_len == kv_len per request."""
    return sum(prefill_flops(mask, n, n, num_qo_heads, head_dim) for n in lens)


def decode_kv_bytes(
    kv_lens: Iterable[int],
    num_kv_heads: int,
    head_dim: int,
    elem: int = 2,
    mask: Mask | None = None,
) -> int:
    """Bytes of K and V read once for a decode batch: only the keys the one query of each
    request may see under ``mask`` (a sliding window reads ``window`` keys, not all)."""
    mask = mask or Mask("causal")
    keys = sum(visible_keys(mask, n - 1, n) for n in kv_lens)
    return 2 * keys * num_kv_heads * head_dim * elem
