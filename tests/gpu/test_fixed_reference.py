"""Soft-cap against the float64 reference on both sides of the fixed softmax reference's limit.

The Hopper kernel runs a bf16 variant whose logits are bounded (soft-cap: |cap| log2(e) in
log2 units) with the reference max fixed at that bound when it is at most 50 (|cap| <= 34.65,
``attnc/kernels/include/attnc/fixed_reference.cuh``), and with the online reference above it.
The caps below straddle the limit; the inputs drive the logits to both ends of their range:
rows whose every key sits at -cap (weights near 2^-2U, the smallest the fixed reference
makes), rows at +cap, rows that see no key (causal, q_len > kv_len), and split-KV rows
(merged). FA2 (online reference only) runs the same cases."""

import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])
LIMIT_CAP = 50.0 / math.log2(math.e)  # 34.657...: the largest cap with a fixed reference
CAPS = [1.0, 30.0, 34.6, 34.7, 50.0]
LSE_TOL = 2e-3  # natural log


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _inputs(q_len: int, kv_len: int, d: int, seed: int, hq: int = 4, hkv: int = 2):
    """Random q, k, v with query heads 0 and 1 (KV head 0) steered: head 0 points against
    every key (all its logits near -cap), head 1 along them (near +cap); heads 2, 3 plain."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=g)
    k = torch.randn(kv_len, hkv, d, generator=g) * 0.1 + base
    q = torch.randn(q_len, hq, d, generator=g)
    q[:, 0] = -16.0 * base + 0.1 * q[:, 0]
    q[:, 1] = 16.0 * base + 0.1 * q[:, 1]
    v = torch.randn(kv_len, hkv, d, generator=g)
    return (t.to("cuda", torch.bfloat16) for t in (q, k, v))


def _check(variant, o, lse, q, k, v, cap: float) -> None:
    ref_o, ref_lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True, cap=cap)
    ref16 = variant.reference(q, k, v, cap=cap)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~seen), "rows without a key must have LSE -inf"
    assert (o[~seen] == 0).all(), "rows without a key must have O 0"
    lse_err = (lse[seen].double() - ref_lse[seen]).abs().max().item()
    assert lse_err <= LSE_TOL, f"cap {cap}: LSE off by {lse_err}"
    for h in range(o.shape[1]):
        rows = seen[:, h]
        err = _rel_err(o[rows, h], ref_o[rows, h])
        floor = _rel_err(ref16[rows, h], ref_o[rows, h])
        assert err <= 3 * floor + 2e-3, f"cap {cap}, head {h}: {err} > 3 x {floor}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("q_len, kv_len", [(300, 1200), (2048, 2048), (40, 20)])
def test_softcap_matches_the_float64_reference(backend, cap, d, q_len, kv_len):
    variant = attnc.load("stdlib:softcap")
    q, k, v = _inputs(q_len, kv_len, d, seed=d + q_len)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, cap=cap)
    _check(variant, o, lse, q, k, v, cap)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap", [30.0, LIMIT_CAP, 50.0])
def test_softcap_split_kv_rows_merge_exactly(backend, cap):
    """Short queries on long, ragged KV: the plan splits each request's keys over chunks
    whose partial rows (O, LSE at the fixed or the online reference) the merge kernel
    combines."""
    variant = attnc.load("stdlib:softcap")
    q_lens, kv_lens = [3, 1, 17], [9000, 4099, 130]
    d, hq, hkv = 128, 4, 2
    q, k, v = _inputs(sum(q_lens), sum(kv_lens), d, seed=7, hq=hq, hkv=hkv)
    qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend=backend)
    w.plan(qo, kv, hq, hkv, d, dtype=torch.bfloat16)
    o, lse = w.run(q, (k, v), return_lse=True, cap=cap)
    for i in range(len(q_lens)):
        qs, qe, ks, ke = int(qo[i]), int(qo[i + 1]), int(kv[i]), int(kv[i + 1])
        _check(variant, o[qs:qe], lse[qs:qe], q[qs:qe], k[ks:ke], v[ks:ke], cap)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softcap_fp16_keeps_the_online_reference_exact(backend):
    """fp16 P cannot hold weights below 2^-14, so fp16 never takes the fixed reference: the
    rows at -cap (their weights relative to a fixed reference would be 2^-86) stay exact."""
    variant = attnc.load("stdlib:softcap")
    q, k, v = (t.half() for t in _inputs(300, 1200, 128, seed=3))
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, cap=30.0)
    _check(variant, o, lse, q, k, v, 30.0)
