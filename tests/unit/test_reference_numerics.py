"""The eager reference's numerics at the edges: float32 accumulation of Q·Kᵀ for 16-bit
inputs (as the kernels' fp32 accumulators), and NaN in -> NaN out (output and LSE)."""

import math

import pytest
import torch

import attnc


def _inputs(dtype, scale=1.0, q_len=48, kv_len=64, hq=4, hkv=2, d=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = (scale * torch.randn(q_len, hq, d, generator=gen)).to(dtype)
    k = (scale * torch.randn(kv_len, hkv, d, generator=gen)).to(dtype)
    v = torch.randn(kv_len, hkv, d, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_reference_accumulates_scores_in_float32(dtype):
    """|x| ~ 4 at head_dim 128: rounding Q·Kᵀ to 16 bits gave LSE errors ~1e-2 and output
    errors ~0.2; in float32 only the final output rounding is left."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _inputs(dtype, scale=4.0)
    o, lse = variant.reference(q, k, v, return_lse=True)
    o64, lse64 = variant.reference(q.double(), k.double(), v.double(), return_lse=True)
    assert lse.dtype == torch.float32
    assert (lse.double() - lse64).abs().max().item() < 1e-4
    # What is left is rounding the output to 16 bits (relative 2^-8 for bf16, 2^-11 fp16),
    # plus float32 noise on outputs that cancel to almost 0.
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert ((o.double() - o64).abs() <= unit * o64.abs() + 1e-5).all()


def test_fp16_scores_beyond_fp16_range_stay_finite():
    """Q·Kᵀ of 230400 overflowed fp16 (max 65504) to inf and the output became NaN."""
    variant = attnc.load("stdlib:vanilla")
    q = torch.full((4, 2, 64), 60.0, dtype=torch.float16)
    k = q.clone()
    v = torch.randn(4, 2, 64).half()
    o, lse = variant.reference(q, k, v, return_lse=True)
    o64, lse64 = variant.reference(q.double(), k.double(), v.double(), return_lse=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(o.double(), o64, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(lse.double(), lse64, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_nan_in_q_gives_nan_row(dtype):
    variant = attnc.load("stdlib:causal")
    q, k, v = _inputs(dtype, q_len=8, kv_len=8, d=64)
    q[3, 1, 5] = math.nan
    o, lse = variant.reference(q, k, v, return_lse=True)
    assert torch.isnan(o[3, 1]).all() and torch.isnan(lse[3, 1])
    others = torch.ones(8, 4, dtype=torch.bool)
    others[3, 1] = False
    assert torch.isfinite(o[others]).all() and torch.isfinite(lse[others]).all()


def test_nan_in_k_reaches_only_rows_that_see_it():
    """Causal: key 5 is visible to queries at positions >= 5 only."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _inputs(torch.float32, q_len=8, kv_len=8, hq=2, hkv=1, d=64)
    k[5, 0, 0] = math.nan
    o, lse = variant.reference(q, k, v, return_lse=True)
    assert torch.isnan(lse[5:]).all() and torch.isnan(o[5:]).all()
    assert torch.isfinite(lse[:5]).all() and torch.isfinite(o[:5]).all()


def test_nan_param_gives_nan_rows_but_empty_rows_stay_empty():
    variant = attnc.load("stdlib:softcap")
    q, k, v = _inputs(torch.float32, q_len=4, kv_len=4, hq=2, hkv=1, d=64)
    o, lse = variant.reference(q, k, v, return_lse=True, cap=math.nan)
    assert torch.isnan(o).all() and torch.isnan(lse).all()
    # A row that sees no key is still "no key visible": output 0, LSE -inf.
    window = attnc.load("stdlib:sliding_window")
    o, lse = window.reference(q, k, v, return_lse=True, window=0)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_nan_with_output_transform_stays_nan():
    """Variants with an ``output`` transform kept NaN rows at 0 (they looked unseen)."""
    variant = attnc.load(source="variant scaled { output = out * 2.0; }")
    q, k, v = _inputs(torch.float32, q_len=4, kv_len=4, hq=2, hkv=1, d=64)
    q[0, 0, 0] = math.nan
    o, lse = variant.reference(q, k, v, return_lse=True)
    assert torch.isnan(o[0, 0]).all() and torch.isnan(lse[0, 0])
    assert torch.isfinite(o[1:]).all()
