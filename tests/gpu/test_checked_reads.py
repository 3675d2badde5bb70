"""Reads whose indices the checker cannot prove inside their dims (compiler/index_range.py),
against the float64 reference, on every kernel.

`t` has 64 entries while the requests have up to 700 keys, an index tensor on the device
holds values past both ends of `t`, and a scalar param points past it: each such read is
bounds-checked (`attnc::vm::load_in_shape_`) and reads 0 outside the shape, as the reference
does. A plain read would read past `t` (and the scores would differ from the reference).
"""

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])

CHECKED_READS = """
variant checked_reads {
    param t: tensor<f32>[64];
    param idx: tensor<i32>[kv_len];
    param w: i32 = 0;
    score = score + t[kv_idx] * 0.5 + t[idx[kv_idx]] * 0.25 + t[w];
    mask = kv_idx <= q_pos;
}
"""


def _params(kv_total: int, seed: int, w: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    spread = torch.tensor([-(2**31), -1, 0, 63, 64, 2**31 - 1])
    idx = torch.randint(-70, 140, (kv_total,), generator=g)
    idx[: len(spread)] = spread[: min(len(spread), kv_total)]
    return {
        "t": torch.randn(64, generator=g).float().cuda(),
        "idx": idx.int().cuda(),
        "w": w,
    }


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_the_unproven_reads_are_checked_and_warned_about():
    variant = attnc.load(source=CHECKED_READS)
    assert variant.cuda_source.count("load_in_shape_(p.p_t") >= 3
    assert len([w for w in variant.warnings if "may fall outside its dim 64" in w.message]) == 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("q_len, kv_len, w", [(300, 700, 5), (130, 130, 1000), (1, 90, -3)])
def test_prefill_with_checked_reads_matches_float64(backend, d, q_len, kv_len, w):
    variant = attnc.load(source=CHECKED_READS)
    hq, hkv = 8, 2
    g = torch.Generator().manual_seed(d + q_len)
    q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    params = _params(kv_len, d, w)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, **params
    )
    floor = _rel(variant.reference(q, k, v, **params), ref_o)
    assert _rel(o, ref_o) <= 3 * floor + 2e-4
    assert (lse.double() - ref_lse).abs().max().item() < 2e-3


def test_decode_with_checked_reads_matches_float64():
    variant = attnc.load(source=CHECKED_READS)
    page, hq, hkv, d = 16, 8, 2, 128
    lens = [700, 40, 1]
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(2)).int()
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(int(indptr[-1]), 2, page, hkv, d, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=g).to("cuda", torch.bfloat16)
    params = _params(sum(lens), 5, 70)
    w = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, hq, hkv, d, page)
    o = w.run(q, cache, **params)
    start = 0
    for b, n in enumerate(lens):
        pg = ids[int(indptr[b]) : int(indptr[b + 1])].long().cuda()
        k = cache[pg, 0].reshape(-1, hkv, d)[:n]
        v = cache[pg, 1].reshape(-1, hkv, d)[:n]
        mine = {**params, "idx": params["idx"][start : start + n]}
        ref = variant.reference(q[b : b + 1].double(), k.double(), v.double(), **mine)
        floor = _rel(variant.reference(q[b : b + 1], k, v, **mine), ref)
        assert _rel(o[b : b + 1], ref) <= 3 * floor + 2e-4, f"request {b}"
        start += n
