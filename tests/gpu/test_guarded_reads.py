"""Shared tensor reads under guards against the float64 reference, on every kernel.

A `let` that reads a tensor and is used in several guarded places is computed once, ahead
of its guards, with its reads bounds-checked (`attnc::vm::load_in_shape_`, see
``codegen/guarded_reads.py``): here the guards `kv_idx < 64` keep `t[kv_idx]` inside its 64
entries while the requests have up to 700 keys, so a plain read ahead of the guard would
read past `t` and a wrong check would change the scores of the guarded keys.
"""

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])

GUARDED_READS = """
variant guarded_reads {
    param t: tensor<f32>[64];
    param h: tensor<f32>[num_qo_heads, 4];
    param w: tensor<f32>[kv_len, 2];
    let a0 = t[kv_idx] * 0.5 + h[qo_head, kv_idx % 4] + w[q_pos, 1];
    let a1 = (kv_idx < 32 ? a0 : 0.25) + (kv_idx < 48 ? a0 : -0.25);
    let a2 = (kv_idx < 16 ? a1 : 0.5) * (kv_idx < 40 ? a1 : 1.0) + a1;
    score = kv_idx < 64 ? score + a2 : score - 1.0;
    mask = kv_idx <= q_pos;
}
"""


def _params(hq: int, kv_total: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "t": torch.randn(64, generator=g).float().cuda(),
        "h": torch.randn(hq, 4, generator=g).float().cuda(),
        "w": torch.randn(kv_total, 2, generator=g).float().cuda(),
    }


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("q_len, kv_len", [(300, 700), (130, 130), (1, 90)])
def test_prefill_with_shared_guarded_reads_matches_float64(backend, d, q_len, kv_len):
    variant = attnc.load(source=GUARDED_READS)
    assert "load_in_shape_(p.p_t" in variant.cuda_source
    hq, hkv = 8, 2
    g = torch.Generator().manual_seed(d + q_len)
    q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    params = _params(hq, kv_len, d)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, **params
    )
    floor = _rel(variant.reference(q, k, v, **params), ref_o)
    assert _rel(o, ref_o) <= 3 * floor + 2e-4
    assert (lse.double() - ref_lse).abs().max().item() < 2e-3


def test_decode_with_shared_guarded_reads_matches_float64():
    variant = attnc.load(source=GUARDED_READS)
    page, hq, hkv, d = 16, 8, 2, 128
    lens = [700, 40, 1]
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(2)).int()
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(int(indptr[-1]), 2, page, hkv, d, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=g).to("cuda", torch.bfloat16)
    params = _params(hq, sum(lens), 5)
    w = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, hq, hkv, d, page)
    o = w.run(q, cache, **params)
    start = 0
    for b, n in enumerate(lens):
        pg = ids[int(indptr[b]) : int(indptr[b + 1])].long().cuda()
        k = cache[pg, 0].reshape(-1, hkv, d)[:n]
        v = cache[pg, 1].reshape(-1, hkv, d)[:n]
        mine = {**params, "w": params["w"][start : start + n]}
        ref = variant.reference(q[b : b + 1].double(), k.double(), v.double(), **mine)
        floor = _rel(variant.reference(q[b : b + 1], k, v, **mine), ref)
        assert _rel(o[b : b + 1], ref) <= 3 * floor + 2e-4, f"request {b}"
        start += n
