"""Steep linear biases against the float64 reference: the Hopper template steps a bias linear
in kv_idx (ALiBi's) from each lane's first key of a tile, which leaves the f32 rounding of
that start (2^-24 of up to 127 keys' worth of bias) in the logits near the diagonal. Rows
steeper than 16 log2 units a key are evaluated per key instead (``docs/runtime.md``). Before
that limit, a slope of 3e3 put the LSE of its rows 0.03 off; ALiBi's usual slopes and the
slopes just under the limit must stay as exact as the per-key bias of the FA2 template."""

import pytest
import torch

import attnc

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])
# One slope per query head: ALiBi's usual ones, two either side of the stepping limit (16 log2
# units a key is a slope of 11.09), and steep ones.
SLOPES = [2.0**-8, 0.5, 8.0, 11.0, 12.0, 30.0, 300.0, 3000.0]
LSE_TOL = 1e-3  # natural log; the stepped start's rounding at 3e3 was 0.03


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("q_len, kv_len", [(300, 1200), (1024, 1024), (2048, 2100)])
def test_steep_alibi_slopes_match_the_float64_reference(backend, d, q_len, kv_len):
    """(2048 queries take the three-consumer kernel at head_dim 128, whose QK GEMM adds the
    bias's steps: the warps of the four shallow heads there, the steep ones per element.)"""
    variant = attnc.load("stdlib:alibi")
    hq, hkv = len(SLOPES), 2
    g = torch.Generator().manual_seed(d + q_len)
    q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    slopes = torch.tensor(SLOPES, dtype=torch.float32, device="cuda")

    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, slopes=slopes)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, slopes=slopes
    )
    ref16 = variant.reference(q, k, v, slopes=slopes)

    lse_err = (lse.double() - ref_lse.double()).abs().amax(0)  # per head
    bad = {SLOPES[h]: round(e, 5) for h, e in enumerate(lse_err.tolist()) if e > LSE_TOL}
    assert not bad, f"LSE off the float64 reference by more than {LSE_TOL} (slope: error): {bad}"
    for h in range(hq):
        err, floor = _rel_err(o[:, h], ref_o[:, h]), _rel_err(ref16[:, h], ref_o[:, h])
        assert err <= 3 * floor + 2e-4, f"head {h} (slope {SLOPES[h]}): {err} > 3 x {floor}"


# ALiBi with a learned sink per head: at head_dim 64 the Hopper kernel holds the logits in
# units of each row's step, and a row that starts at its sink starts in those units too
# (`row_units`). No stdlib variant has both, so the variant is written here.
ALIBI_SINK = """
variant alibi_sink {
    param slopes: tensor<f32>[num_qo_heads];
    param sinks: tensor<f32>[num_qo_heads];
    sink = sinks[qo_head];
    score = score + slopes[qo_head] * (kv_idx - q_pos);
    mask = kv_idx <= q_pos;
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("q_len, kv_len", [(300, 1200), (2048, 2048), (40, 20)])
def test_alibi_with_sinks_matches_the_float64_reference(backend, d, q_len, kv_len):
    variant = attnc.load(source=ALIBI_SINK)
    hq, hkv = len(SLOPES), 2
    g = torch.Generator().manual_seed(d + q_len + 1)
    q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
    params = {
        "slopes": torch.tensor(SLOPES, dtype=torch.float32, device="cuda"),
        "sinks": (torch.randn(hq, generator=g) * 3.0).float().cuda(),
    }

    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, **params
    )
    ref16 = variant.reference(q, k, v, **params)

    assert torch.isfinite(lse).all(), "a sink keeps every row's LSE finite"
    lse_err = (lse.double() - ref_lse.double()).abs().amax(0)
    bad = {SLOPES[h]: round(e, 5) for h, e in enumerate(lse_err.tolist()) if e > LSE_TOL}
    assert not bad, f"LSE off the float64 reference by more than {LSE_TOL} (slope: error): {bad}"
    if q_len > kv_len:  # the first rows see no key: O is 0 and the LSE is the sink
        assert (o[: q_len - kv_len] == 0).all()
    for h in range(hq):
        err, floor = _rel_err(o[:, h], ref_o[:, h]), _rel_err(ref16[:, h], ref_o[:, h])
        assert err <= 3 * floor + 2e-4, f"head {h} (slope {SLOPES[h]}): {err} > 3 x {floor}"
