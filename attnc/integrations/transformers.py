"""Owns: the ``"attnc"`` attention implementation for Hugging Face transformers.

Importing this module registers two functions under the name ``"attnc"``:

- in ``transformers.AttentionMaskInterface`` a mask builder. transformers calls it once per
  forward and mask kind (full / sliding layers) with the 2D padding mask and the cache
  offsets; it builds the boolean mask transformers would give ``sdpa`` and turns it into one
  request per batch row (:mod:`attnc.integrations.hf_masks`), shared by all layers of the kind.
- in ``transformers.AttentionInterface`` the attention function: it picks the layer's variant
  (:mod:`attnc.integrations.hf_variants`), packs the rows' valid queries and keys into ragged
  tensors and runs them: on CUDA (bf16/fp16, head_dim 64/128/256) through
  ``attnc.BatchPrefillWrapper``, planned once per step and mask kind; otherwise through the
  variant's generated PyTorch reference, with a one-time warning. Decode steps (every row
  one request of 1..8 valid queries) read the cache tensors in place through
  ``attnc.BatchDecodeWrapper`` instead (:mod:`attnc.integrations.hf_decode`).

Then ``AutoModelForCausalLM.from_config(cfg, attn_implementation="attnc")`` or
``model.set_attn_implementation("attnc")`` runs every attention layer through attnc.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnc.integrations.hf_decode import (
    decode_queries,
    is_decode_call,
    release_decode_wrappers,
    run_decode_kernels,
    run_decode_reference,
    token_pages,
)
from attnc.integrations.hf_masks import (
    BatchSegments,
    RowSegment,
    UnsupportedMaskError,
    segments_for_call,
    segments_from_visibility,
)
from attnc.integrations.hf_sinks import SINK_SOURCES, sink_kernel_gap
from attnc.integrations.hf_variants import LayerVariant, layer_name, variant_for_layer
from attnc.runtime.checks.tensors import HEAD_DIMS, KV_DTYPES, check_sm_scale

__all__ = [
    "ATTN_IMPLEMENTATION",
    "UnsupportedMaskError",
    "attnc_attention_forward",
    "attnc_mask",
    "register",
    "release_decode_wrappers",
]

ATTN_IMPLEMENTATION = "attnc"
WORKSPACE_BYTES = 64 << 20
_warned: set[str] = set()


def attnc_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | BatchSegments | None = None,
    config: Any = None,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> BatchSegments:
    """The ``AttentionMaskInterface`` entry: the step's requests, one per batch row."""
    if isinstance(attention_mask, BatchSegments):  # built earlier (generate, static cache)
        return attention_mask
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    q_offset = _offset("q_offset", q_offset)
    kv_offset = _offset("kv_offset", kv_offset)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        if attention_mask.dtype not in (torch.bool, torch.int32, torch.int64):
            raise ValueError(
                "attention_mask: a 2D padding mask must be bool or integer (1 = token, "
                f"0 = padding), got {attention_mask.dtype}"
            )

    visible = sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function or causal_mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        use_vmap=use_vmap,
        device=device,
    )
    if visible is None:  # only with the skips, which are off
        raise UnsupportedMaskError("transformers built no mask for this call")
    window = getattr(config, "sliding_window", None)
    candidates = (None, window if isinstance(window, int) else None)
    query_start = q_offset - kv_offset
    return segments_from_visibility(
        visible.expand(batch_size, -1, q_length, kv_length)[:, 0], query_start, candidates
    )


def attnc_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: object,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` entry. query ``[B, H_qo, Q, D]``, key/value ``[B, H_kv, KV, D]``
    -> (output ``[B, Q, H_qo, D]``, no attention weights)."""
    _check_shapes(module, query, key, value)
    scaling = _check_scaling(module, scaling, query.shape[3])
    choice = variant_for_layer(
        module, dropout=dropout, sliding_window=sliding_window, softcap=softcap, kwargs=kwargs
    )
    batch, hq, q_len, head_dim = query.shape
    hkv, kv_len = key.shape[1], key.shape[2]
    groups = getattr(module, "num_key_value_groups", hq // max(hkv, 1))
    if hkv * groups != hq:
        raise UnsupportedMaskError(
            f"{layer_name(module)}: {hq} query heads are not {groups} groups of {hkv} KV heads"
        )
    if choice.spec in SINK_SOURCES and _kernel_blocker(query, head_dim) is None:
        gap = sink_kernel_gap(query.device, query.dtype, head_dim)
        if gap is not None:
            raise UnsupportedMaskError(f"{layer_name(module)}: attention sinks on CUDA: {gap}")
    segments = segments_for_call(attention_mask, q_len, kv_len, batch, choice.window)
    if segments.windows is not None and choice.window not in segments.windows:
        segments.require_window(choice.window, layer_name(module))  # raises, naming the layer
    if not segments.segments:
        return query.new_zeros(batch, q_len, hq, head_dim), None
    if is_decode_call(segments, q_len):
        o_decode = _run_decode(choice, segments, query, key, value, scaling)
        if o_decode is not None:
            return o_decode.reshape(batch, q_len, hq, head_dim), None
    q_packed = _pack(query, segments, queries=True)
    k_packed = _pack(key, segments, queries=False)
    v_packed = _pack(value, segments, queries=False)
    packed = PackedCall(choice, segments, q_packed, k_packed, v_packed, scaling)
    reason = _kernel_blocker(query, head_dim)
    if reason is None:
        o_packed = _run_kernels(packed)
    else:
        _warn_once(reason)
        o_packed = _run_reference(packed)
    first = segments.segments[0]
    if segments.is_uniform and (first.q_begin, first.q_end) == (0, q_len):
        return o_packed.view(batch, q_len, hq, head_dim), None  # no padding: no scatter
    out = query.new_zeros(batch, q_len, hq, head_dim)
    _unpack_into(out, o_packed, segments)
    return out, None


def _offset(arg: str, value: object) -> int:
    """A cache offset of ``attnc_mask``: one whole number (an int, a numpy integer or a
    one-element integer tensor)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_floating_point() or value.dtype == torch.bool:
            raise ValueError(
                f"{arg}: expected one whole number, got a {value.dtype} tensor of shape "
                f"{tuple(value.shape)}"
            )
        return int(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{arg}: expected one whole number, got {type(value).__name__}")
    return int(value)  # numpy integers too (a cache position read from an array)


def _check_shapes(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> None:
    """ValueError unless query is ``[B, H_qo, Q, D]`` and key/value ``[B, H_kv, KV, D]`` of
    one shape (UnsupportedMaskError for a value head_dim other than the key's)."""
    name = layer_name(module)
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            found = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name}: {arg}: expected a 4D tensor [batch, heads, seq, head_dim], got {found}"
            )
    if query.shape[3] < 1:
        raise ValueError(f"{name}: query: head_dim is 0")
    if key.shape[0] != query.shape[0]:
        raise ValueError(f"{name}: key: batch {key.shape[0]}, but query has {query.shape[0]}")
    if key.shape[3] != query.shape[3]:
        raise ValueError(f"{name}: key: head_dim {key.shape[3]}, but query has {query.shape[3]}")
    if value.shape[3] != key.shape[3]:
        raise UnsupportedMaskError(
            f"{name}: value head_dim {value.shape[3]} differs from key head_dim {key.shape[3]}; "
            "attnc variants need one head_dim"
        )
    if value.shape != key.shape:
        raise ValueError(
            f"{name}: value: shape {tuple(value.shape)} differs from key's {tuple(key.shape)}"
        )


def _check_scaling(module: torch.nn.Module, scaling: object, head_dim: int) -> float:
    """The layer's ``scaling`` as the kernels' ``sm_scale``: a finite float > 0 (None gives
    ``1 / sqrt(head_dim)``). A ValueError names the layer and ``scaling`` (Gemma-2 with a
    negative ``query_pre_attn_scalar`` passes a complex number)."""
    try:
        return check_sm_scale(scaling, head_dim)
    except ValueError as err:
        detail = str(err).removeprefix("sm_scale: ")
        raise ValueError(f"{layer_name(module)}: scaling: {detail}") from None


def _run_decode(
    choice: LayerVariant,
    segments: BatchSegments,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor | None:
    """A decode-shaped call over the cache tensors in place: ``[B * Q, H_qo, D]``, or None
    when their strides or a wrapper's capacity rule it out (the caller packs instead)."""
    pages = token_pages(key, value, segments, choice.window)
    if pages is None:
        return None
    q = decode_queries(query)
    reason = _kernel_blocker(query, query.shape[3])
    if reason is None:
        return run_decode_kernels(choice, segments, pages, q, scaling)
    _warn_once(reason)
    return run_decode_reference(choice, pages, q, scaling)


def _kernel_blocker(query: torch.Tensor, head_dim: int) -> str | None:
    """Why the CUDA kernels cannot run this call (None when they can)."""
    if not query.is_cuda:
        return "attnc: tensors on the CPU run the generated PyTorch reference (slow)"
    if query.dtype not in KV_DTYPES:
        return f"attnc: {query.dtype} runs the generated PyTorch reference (kernels: bf16/fp16)"
    if head_dim not in HEAD_DIMS:
        return f"attnc: head_dim {head_dim} runs the generated PyTorch reference"
    return None


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _pack(x: torch.Tensor, segments: BatchSegments, *, queries: bool) -> torch.Tensor:
    """``[B, H, S, D]`` -> ragged ``[tokens, H, D]`` holding each segment's rows in order."""
    rows = x.transpose(1, 2)  # [B, S, H, D], a view
    if segments.is_uniform:
        lo, hi = _span(segments.segments[0], queries)
        return rows[:, lo:hi].reshape(-1, x.shape[1], x.shape[3])
    parts = [rows[s.row, slice(*_span(s, queries))] for s in segments.segments]
    return torch.cat(parts, dim=0).contiguous()


def _span(s: RowSegment, queries: bool) -> tuple[int, int]:
    return (s.q_begin, s.q_end) if queries else (s.kv_begin, s.kv_end)


def _unpack_into(out: torch.Tensor, packed: torch.Tensor, segments: BatchSegments) -> None:
    """Scatter ragged ``[tokens, H, D]`` back into ``out [B, Q, H, D]`` (padding stays 0)."""
    if segments.is_uniform:
        first = segments.segments[0]
        out[:, first.q_begin : first.q_end] = packed.view(out.shape[0], -1, *out.shape[2:])
        return
    start = 0
    for s in segments.segments:
        n = s.q_end - s.q_begin
        out[s.row, s.q_begin : s.q_end] = packed[start : start + n]
        start += n


@dataclass(frozen=True)
class PackedCall:
    """One call's tokens packed segment after segment (q ``[total_q, H_qo, D]``, k/v
    ``[total_kv, H_kv, D]``) with the layer's variant and the softmax scale."""

    choice: LayerVariant
    segments: BatchSegments
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scaling: float | None


def _run_reference(call: PackedCall) -> torch.Tensor:
    """Each segment through the variant's generated PyTorch reference."""
    variant, params = call.choice.variant, call.choice.run_params()
    outs, q0, k0 = [], 0, 0
    for s in call.segments.segments:
        nq, nk = s.q_end - s.q_begin, s.kv_end - s.kv_begin
        outs.append(
            variant.reference(
                call.q[q0 : q0 + nq],
                call.k[k0 : k0 + nk],
                call.v[k0 : k0 + nk],
                sm_scale=call.scaling,
                **params,
            )
        )
        q0, k0 = q0 + nq, k0 + nk
    return torch.cat(outs, dim=0)


def _run_kernels(call: PackedCall) -> torch.Tensor:
    """The segments as one ragged batch through ``attnc.BatchPrefillWrapper``; the plan is
    kept on ``segments`` so the layers that share the step's mask plan once."""
    choice, segments, scaling = call.choice, call.segments, call.scaling
    q, k, v = call.q, call.k, call.v
    hq, hkv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    plan_key = (choice.spec, choice.window, hq, hkv, head_dim, q.dtype, scaling, q.device)
    wrapper = segments.plans.get(plan_key)
    if wrapper is None:
        import attnc

        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        wrapper = attnc.BatchPrefillWrapper(choice.variant, workspace, kv_layout="NHD")
        qo_lens = [s.q_end - s.q_begin for s in segments.segments]
        kv_lens = [s.kv_end - s.kv_begin for s in segments.segments]
        wrapper.plan(
            _indptr(qo_lens),
            _indptr(kv_lens),
            hq,
            hkv,
            head_dim,
            sm_scale=scaling,
            dtype=q.dtype,
            params=choice.plan_params(),
        )
        segments.plans[plan_key] = wrapper
    return wrapper.run(q.contiguous(), (k.contiguous(), v.contiguous()), **choice.run_params())


def _indptr(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device="cpu")
    out[1:] = torch.tensor(lengths, dtype=torch.int32, device="cpu").cumsum(0)
    return out


def register() -> None:
    """Register ``"attnc"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface

    try:
        from transformers import AttentionMaskInterface
    except ImportError:  # older releases keep it in masking_utils only
        from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, attnc_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, attnc_mask)


register()
