"""Where the GPU suite's accuracy rule comes from: a CPU model of the kernels' numerics against
the float64 reference, next to the eager 16-bit reference's own error.

The kernels compute Q·Kᵀ from 16-bit inputs into float32, run the online softmax in float32
tile by tile, round P to 16 bits for the P·V tensor-core product (float32 accumulation) and
round O to 16 bits at the end. The eager reference does the same except for rounding P, so
its error is the final rounding of O; the model lands within 1.5x of it. The GPU tests allow
``3 * eager + 2e-4`` (``tests/gpu/test_prefill.py``), twice this margin.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnc

ERR_FACTOR, ERR_FLOOR = 3.0, 2e-4  # as in tests/gpu/test_prefill.py and test_decode.py
KV_TILE = 64


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def kernel_model(variant, q, k, v, params, kv_tile=KV_TILE):
    """O as the kernels round it: the reference's float32 scores and mask, then an online
    softmax over KV tiles with P rounded to q's dtype before P·V."""
    _, s_visible = _scores(variant, q, k, params)
    hq = q.shape[1]
    vx = v.repeat_interleave(hq // k.shape[1], 1).float().permute(1, 0, 2)
    m = torch.full((*s_visible.shape[:2], 1), -math.inf)
    denom = torch.zeros_like(m)
    acc = torch.zeros(*s_visible.shape[:2], q.shape[2])
    for t0 in range(0, k.shape[0], kv_tile):
        tile = s_visible[:, :, t0 : t0 + kv_tile]
        m_new = torch.maximum(m, tile.amax(-1, keepdim=True))
        base = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        p = torch.exp(tile - base)
        alpha = torch.exp(torch.where(torch.isfinite(m), m, base) - base)
        denom = denom * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p.to(q.dtype).float() @ vx[:, t0 : t0 + kv_tile]
        m = m_new
    o = torch.where(denom > 0, acc / denom.clamp_min(1e-30), torch.zeros_like(acc))
    return o.permute(1, 0, 2).to(q.dtype)


def _scores(variant, q, k, params):
    """The transformed float32 scores [H, q, kv] of the reference, masked with -inf."""
    module = variant.reference_module
    from attnc.runtime.reference import _environment

    q_len, hq, d = q.shape
    kv_len, hk, _ = k.shape
    kx = k.repeat_interleave(hq // hk, 1).float()
    scale = 1.0 / math.sqrt(d)
    s = torch.einsum("qhd,khd->hqk", q.float(), kx) * scale
    env = _environment(q, torch.float32, s, scale, params, 0, q_len, kv_len, hq, hk, d)
    t = (module.score(env, {}) if module.HAS_SCORE else s).float().expand(hq, q_len, kv_len)
    if module.HAS_MASK:
        t = t.masked_fill(~module.mask(env, {}).expand(hq, q_len, kv_len), -math.inf)
    return s, t


CASES = [(17, 577, 128, 4), (127, 300, 64, 1), (1, 1025, 256, 2)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("name", "params"), [("causal", {}), ("softcap", {"cap": 30.0})])
@pytest.mark.parametrize(("q_len", "kv_len", "head_dim", "group"), CASES)
def test_kernel_numerics_within_the_gpu_rule(dtype, name, params, q_len, kv_len, head_dim, group):
    variant = attnc.load(f"stdlib:{name}")
    gen = torch.Generator().manual_seed(q_len * 7919 + kv_len)
    hq, hkv = 2 * group, 2
    q = torch.randn(q_len, hq, head_dim, generator=gen).to(dtype)
    k = torch.randn(kv_len, hkv, head_dim, generator=gen).to(dtype)
    v = torch.randn(kv_len, hkv, head_dim, generator=gen).to(dtype)
    ref = variant.reference(q.double(), k.double(), v.double(), **params)
    eager = _rel(variant.reference(q, k, v, **params), ref)
    model = _rel(kernel_model(variant, q, k, v, params), ref)
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert eager <= unit  # only O's final rounding is left in the reference
    assert model <= 1.5 * eager
    assert model <= (ERR_FACTOR * eager + ERR_FLOOR) / 2
