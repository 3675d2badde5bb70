"""ALiBi's stepped bias computed by the QK GEMM (the Hopper three-consumer kernel at head_dim
128, ``kGemmBiasVariant``): each S tile takes one more k-step that adds the row's step over its
exp2 multiplier times the key's index in the tile, and the softmax adds the bias at the tile's
first key per row. Checked against the float64 reference with queries long enough for three
consumers, in both 16-bit types, and with rows the GEMM cannot carry (a multiplier so small
that step / multiplier passes 16384, NaN and infinite slopes), whose warps evaluate the bias
per element; and with negative and mixed-sign slopes."""

import pytest
import torch

import attnc

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the Hopper template runs on sm_90", allow_module_level=True)

HQ, HKV, D = 8, 2, 128


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _inputs(n: int, m: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(t, h, D, generator=g).to("cuda", dtype)
        for t, h in ((n, HQ), (m, HKV), (m, HKV))
    )


def _check_against_float64(variant, q, k, v, slopes: torch.Tensor) -> None:
    """Hopper prefill of ALiBi with these slopes: LSE within 1e-3 of float64, and each head's
    output within 3 x the 16-bit reference's error + 2e-4."""
    o, lse = variant.prefill(q, k, v, return_lse=True, backend="sm90", slopes=slopes)
    ref_o, ref_lse = variant.reference(
        q.double(), k.double(), v.double(), return_lse=True, slopes=slopes
    )
    ref16 = variant.reference(q, k, v, slopes=slopes)
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-3
    for h in range(HQ):
        err, floor = _rel_err(o[:, h], ref_o[:, h]), _rel_err(ref16[:, h], ref_o[:, h])
        assert err <= 3 * floor + 2e-4, f"head {h} (slope {slopes[h].item()}): {err} > 3 x {floor}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, m", [(2048, 2048), (2100, 2300), (2048, 4096)])
def test_alibi_on_three_consumers_matches_float64(dtype, n, m):
    variant = attnc.load("stdlib:alibi")
    q, k, v = _inputs(n, m, dtype, n + m)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / HQ) for h in range(HQ)], device="cuda")
    _check_against_float64(variant, q, k, v, slopes)


def test_rows_the_gemm_cannot_carry_take_the_bias_per_element():
    """sm_scale 1e-6 puts step / multiplier near 1e6 for every row (all warps per element); a
    NaN slope (head 2) and an infinite one (head 5) each send their warps per element: those
    heads come out as the reference has them (NaN rows), the rest match it."""
    variant = attnc.load("stdlib:alibi")
    q, k, v = _inputs(2048, 2048, torch.bfloat16, 7)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / HQ) for h in range(HQ)], device="cuda")
    for scale, bad in ((1e-6, {}), (None, {2: float("nan"), 5: float("inf")})):
        s = slopes.clone()
        for h, value in bad.items():
            s[h] = value
        kw = {} if scale is None else {"sm_scale": scale}
        o = variant.prefill(q, k, v, backend="sm90", slopes=s, **kw)
        ref_o = variant.reference(q.double(), k.double(), v.double(), slopes=s, **kw)
        ref16 = variant.reference(q, k, v, slopes=s, **kw)
        for h in range(HQ):
            nan_ref = torch.isnan(ref_o[:, h])
            assert torch.equal(torch.isnan(o[:, h]), nan_ref), (
                f"head {h}: NaN where the reference has none"
            )
            if nan_ref.all():
                continue
            err = _rel_err(o[:, h].nan_to_num(), ref_o[:, h].nan_to_num())
            floor = _rel_err(ref16[:, h].nan_to_num(), ref_o[:, h].nan_to_num())
            assert err <= 3 * floor + 2e-4, f"scale {scale}, head {h}: {err} > 3 x {floor}"


def test_negative_and_mixed_slopes_on_three_consumers():
    """Negative steps (the bias grows away from the diagonal, so the reversed KV walk meets the
    largest logits last) next to positive ones in the same KV head's group: the GEMM carries
    both signs, and rows that move their max on every tile still match the reference."""
    variant = attnc.load("stdlib:alibi")
    q, k, v = _inputs(2048, 2100, torch.bfloat16, 3)
    slopes = torch.tensor([-0.5, -(2.0**-3), 2.0**-8, 0.5, -1.0, 0.25, -0.01, 1.0], device="cuda")
    _check_against_float64(variant, q, k, v, slopes)
