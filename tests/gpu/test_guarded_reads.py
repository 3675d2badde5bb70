"""Bounds-checked tensor reads against the float64 reference, on every kernel.

Two kinds of read go through `attnc::vm::load_in_shape_` (0 outside the declared shape):

- guarded: a `let` that reads a tensor and is used in several guarded places is computed once,
  ahead of its guards (``codegen/guarded_reads.py``). The guards `kv_idx < 64` keep `t[kv_idx]`
  inside its 64 entries while the requests have up to 700 keys, so a plain read ahead of the
  guard would read past `t`, and a wrong check would change the scores of the guarded keys.
- unproven: a read whose index the checker cannot prove inside its dim
  (``compiler/index_range.py``): `t[kv_idx]` past 64 entries, an index tensor on the device
  with values past both ends of `t`, a scalar param past it. Such a read gives 0 outside the
  shape, in the kernels and the reference alike. `idx[kv_idx]` in the score is also a read by
  key (``kScoreReadsByKey``): past a tail tile's end the score sees the tile's last key.
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

UNPROVEN_READS = """
variant unproven_reads {
    param t: tensor<f32>[64];
    param idx: tensor<i32>[kv_len];
    param s: i32 = 0;
    score = score + t[kv_idx] * 0.5 + t[idx[kv_idx]] * 0.25 + t[s];
    mask = kv_idx <= q_pos;
}
"""


def _guarded_params(hq: int, kv_total: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "t": torch.randn(64, generator=g).float().cuda(),
        "h": torch.randn(hq, 4, generator=g).float().cuda(),
        "w": torch.randn(kv_total, 2, generator=g).float().cuda(),
    }


def _unproven_params(hq: int, kv_total: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-70, 140, (kv_total,), generator=g)
    ends = torch.tensor([-(2**31), -1, 0, 63, 64, 2**31 - 1])[:kv_total]
    idx[: len(ends)] = ends
    return {
        "t": torch.randn(64, generator=g).float().cuda(),
        "idx": idx.int().cuda(),
        "s": [5, 1000, -3][seed % 3],
    }


VARIANTS = {
    "guarded": (GUARDED_READS, _guarded_params),
    "unproven": (UNPROVEN_READS, _unproven_params),
}


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_each_variant_reads_through_the_check():
    guarded = attnc.load(source=GUARDED_READS)
    assert "load_in_shape_(p.p_t" in guarded.cuda_source
    unproven = attnc.load(source=UNPROVEN_READS)
    assert unproven.cuda_source.count("load_in_shape_(p.p_t") >= 3
    assert "kScoreReadsByKey = true" in unproven.cuda_source
    outside = [w for w in unproven.warnings if "may fall outside its dim 64" in w.message]
    assert len(outside) == 3


@pytest.mark.parametrize("kind", list(VARIANTS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("q_len, kv_len", [(300, 700), (130, 130), (1, 90)])
def test_prefill_with_checked_reads_matches_float64(kind, backend, d, q_len, kv_len):
    source, make_params = VARIANTS[kind]
    variant = attnc.load(source=source)
    hq, hkv = 8, 2
    g = torch.Generator().manual_seed(d + q_len)
    q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    params = make_params(hq, kv_len, d + q_len)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, **params
    )
    floor = _rel(variant.reference(q, k, v, **params), ref_o)
    assert _rel(o, ref_o) <= 3 * floor + 2e-4
    assert (lse.double() - ref_lse).abs().max().item() < 2e-3


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_decode_with_checked_reads_matches_float64(kind):
    source, make_params = VARIANTS[kind]
    variant = attnc.load(source=source)
    per_token = [p.name for p in variant.params if p.dims and p.dims[0] == "kv_len"]
    page, hq, hkv, d = 16, 8, 2, 128
    lens = [700, 40, 1]
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.randperm(int(indptr[-1]), generator=torch.Generator().manual_seed(2)).int()
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(int(indptr[-1]), 2, page, hkv, d, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=g).to("cuda", torch.bfloat16)
    params = make_params(hq, sum(lens), 5)
    w = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, hq, hkv, d, page)
    o = w.run(q, cache, **params)
    start = 0
    for b, n in enumerate(lens):
        pg = ids[int(indptr[b]) : int(indptr[b + 1])].long().cuda()
        k = cache[pg, 0].reshape(-1, hkv, d)[:n]
        v = cache[pg, 1].reshape(-1, hkv, d)[:n]
        mine = {**params, **{name: params[name][start : start + n] for name in per_token}}
        ref = variant.reference(q[b : b + 1].double(), k.double(), v.double(), **mine)
        floor = _rel(variant.reference(q[b : b + 1], k, v, **mine), ref)
        assert _rel(o[b : b + 1], ref) <= 3 * floor + 2e-4, f"request {b}"
        start += n
