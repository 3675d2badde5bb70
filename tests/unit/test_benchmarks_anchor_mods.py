"""The anchors' variant definitions: FlexAttention mods against float64, FlashInfer keywords."""

from __future__ import annotations

import pytest

from benchmarks.outcome import Unsupported


def _reference_attention(q, k, v, variant, params):
    """Dense float64 attention from the variant definitions (bottom-right alignment)."""
    import math

    import torch

    q_len, kv_len, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(q_len)[:, None] + kv_len - q_len
    kv_idx = torch.arange(kv_len)[None, :]
    if variant.stdlib == "softcap":
        s = params["cap"] * torch.tanh(s / params["cap"])
    if variant.stdlib == "alibi":
        s = s + params["slopes"].double()[:, None, None] * (kv_idx - q_pos)
    keep = kv_idx <= q_pos
    if variant.stdlib == "sliding_window":
        keep = keep & (q_pos - kv_idx < params["window"])
    if variant.stdlib == "prefix_lm":
        keep = keep | (kv_idx < params["prefix_len"])
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("key", ["causal", "softcap", "alibi", "sliding_window", "prefix_lm"])
@pytest.mark.parametrize("shape", [(40, 40), (24, 70)])
def test_flex_mods_match_variant_definitions(key, shape):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from benchmarks.flex_anchor import block_mask, score_mod
    from benchmarks.inputs import alibi_slopes
    from benchmarks.workloads import VARIANTS, Mask

    small = {"window": 9, "prefix_len": 5}
    spec = VARIANTS[key]
    mask = Mask(spec.mask.kind, window=9, prefix=5)
    params = {k: small.get(k, v) for k, v in spec.scalar_params.items()}
    if key == "alibi":
        params["slopes"] = alibi_slopes(4, device="cpu")
    q_len, kv_len = shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(q_len, 4, 16, generator=gen)
    k, v = (torch.randn(kv_len, 2, 16, generator=gen) for _ in range(2))
    smod = score_mod(spec.stdlib, params, kv_len - q_len)
    bm = block_mask(mask, q_len, kv_len, device="cpu")
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = flex_attention(q4, k4, v4, score_mod=smod, block_mask=bm, enable_gqa=True)
    ref = _reference_attention(q, k, v, spec, params)
    torch.testing.assert_close(out[0].transpose(0, 1).double(), ref, atol=1e-4, rtol=1e-4)


def test_flashinfer_keywords_per_variant():
    from benchmarks.flashinfer_anchor import variant_kwargs
    from benchmarks.workloads import VARIANTS

    assert variant_kwargs(VARIANTS["softcap"])["logits_soft_cap"] == 30.0
    assert variant_kwargs(VARIANTS["sliding_window"])["window_left"] == 1023
    assert variant_kwargs(VARIANTS["alibi"])["pos_encoding_mode"] == "ALIBI"
    for key, backend in (("alibi", "fa3"), ("sigmoid", "fa2"), ("prefix_lm", "fa2")):
        with pytest.raises(Unsupported):
            variant_kwargs(VARIANTS[key], backend)
