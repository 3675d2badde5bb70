"""sm_scale at the GPU entry points: a scale that is not a finite number > 0 raises at
prefill and decode plan() (on an H200 a scale of 0 or below gave NaN output for the plain
scaled dot product on both prefill templates and in decode, a NaN or infinite one NaN
everywhere); positive scales far from 1/sqrt(head_dim) still match the float64 reference."""

import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D, PAGE = 4, 2, 128, 16
I32 = dict(dtype=torch.int32)
BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])
BAD = [0.0, -0.0884, math.nan, math.inf]


def _qkv(q_len, kv_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, h, D, generator=g).to("cuda", torch.bfloat16) * 2
        for n, h in ((q_len, HQ), (kv_len, HKV), (kv_len, HKV))
    )


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def _decode(variant, q, k, v, sm_scale):
    """One request of len(k) keys, paged, its last query token q."""
    n = k.shape[0]
    pages = -(-n // PAGE)
    kp = torch.zeros(pages * PAGE, HKV, D, dtype=k.dtype, device="cuda")
    vp = torch.zeros_like(kp)
    kp[:n], vp[:n] = k, v
    cache = torch.stack([kp.view(pages, PAGE, HKV, D), vp.view(pages, PAGE, HKV, D)], dim=1)
    w = BatchDecodeWrapper(variant, torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(torch.tensor([0, pages], **I32), torch.arange(pages, **I32),
           torch.tensor([n - (pages - 1) * PAGE], **I32), HQ, HKV, D, PAGE, sm_scale=sm_scale)  # fmt: skip
    return w.run(q, cache, return_lse=True)


@pytest.mark.parametrize("sm_scale", BAD)
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_rejects_a_scale_that_is_not_finite_and_positive(backend, sm_scale):
    q, k, v = _qkv(40, 90)
    with pytest.raises(ValueError, match="^sm_scale: must be a finite number > 0"):
        attnc.load("stdlib:causal").prefill(q, k, v, sm_scale=sm_scale, backend=backend)


@pytest.mark.parametrize("sm_scale", BAD)
def test_decode_rejects_a_scale_that_is_not_finite_and_positive(sm_scale):
    q, k, v = _qkv(1, 90)
    with pytest.raises(ValueError, match="^sm_scale: must be a finite number > 0"):
        _decode(attnc.load("stdlib:causal"), q, k, v, sm_scale)


@pytest.mark.parametrize("sm_scale", [1e-3, 1.0])
@pytest.mark.parametrize("backend", BACKENDS + ["decode"])
def test_positive_scales_far_from_the_default_match_the_reference(backend, sm_scale):
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(1 if backend == "decode" else 300, 500, seed=3)
    if backend == "decode":
        o, lse = _decode(variant, q, k, v, sm_scale)
    else:
        o, lse = variant.prefill(q, k, v, sm_scale=sm_scale, return_lse=True, backend=backend)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), sm_scale=sm_scale, return_lse=True
    )
    ref16 = variant.reference(q, k, v, sm_scale=sm_scale)
    assert _rel_err(o, ref_o) <= 3 * _rel_err(ref16, ref_o) + 2e-4
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3
