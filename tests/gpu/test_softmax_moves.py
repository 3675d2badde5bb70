"""Rows whose running max jumps past the online softmax's rescale slack in later KV tiles, on
some rows of a warp and not on the others, against the float64 reference.

The kernels keep a row's reference max until a tile's max exceeds it by more than the slack
(8 in log2 units, online_softmax.cuh), and one warp vote on each lane's own columns decides
whether any row of the warp moves: only then are the row maxima reduced across lanes and O
rescaled. Random inputs move a row's max on its first tile and rarely after, so these inputs
make it move again and again: the keys grow along one direction u by 7 natural-log units of
score every 97 keys (not a multiple of any tile), and each query row points along +u (its max
moves on every step) or -u (its max never moves after the first key), at random per row and
head. Prefill runs on both templates, decode on the paged decode kernel.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

STEP_KEYS, STEP_NATS = 97, 7.0  # 7 nats = 10.1 log2 units, past the slack of 8
JUMP_KEY, JUMP_NATS = 600, 100.0  # 144 log2 units: past fp32's exp2 range
HQ, HKV = 8, 2
PARAMS = {"causal": {}, "softcap": {"cap": 50.0}}


def _ramp_inputs(q_len: int, kv_len: int, d: int, dtype: torch.dtype, seed: int,
                 jump: bool = False):  # fmt: skip
    """q [q_len, HQ, d], k and v [kv_len, HKV, d]: scores of a +u row grow by STEP_NATS every
    STEP_KEYS keys (and, with `jump`, by JUMP_NATS at JUMP_KEY), those of a -u row fall."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    u /= u.norm()
    sign = torch.where(torch.rand(q_len, HQ, 1, generator=gen) < 0.5, -1.0, 1.0).double()
    q = sign * math.sqrt(d) * u + 0.3 * torch.randn(q_len, HQ, d, generator=gen).double()
    keys = torch.arange(kv_len)
    steps = (keys // STEP_KEYS).double() * STEP_NATS
    if jump:
        steps += (keys >= JUMP_KEY).double() * JUMP_NATS
    k = steps[:, None, None] * u + 0.3 * torch.randn(kv_len, HKV, d, generator=gen).double()
    v = torch.randn(kv_len, HKV, d, generator=gen).double()
    return (x.to(dtype).cuda() for x in (q, k, v))


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(variant, q, k, v, o, lse, params) -> None:
    """o and lse against the float64 reference, with test_prefill.py's accuracy rule."""
    ref, ref_lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True,
                                     **params)  # fmt: skip
    eager = variant.reference(q, k, v, **params)
    assert torch.isfinite(o).all(), "non-finite output"
    err, bound = _rel(o, ref), 3 * _rel(eager, ref) + 2e-4
    assert err <= bound, (err, bound)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("backend", ["sm90", "fa2"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", ["causal", "softcap"])
def test_prefill_rows_moving_past_the_slack(name, d, backend):
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs an sm_90 GPU")
    variant = attnc.load(f"stdlib:{name}")
    q, k, v = _ramp_inputs(777, 1500, d, torch.bfloat16, seed=d)
    params = PARAMS[name]
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    _check(variant, q, k, v, o, lse, params)


@pytest.mark.parametrize("name", ["causal", "softcap"])
def test_decode_rows_moving_past_the_slack(name):
    variant = attnc.load(f"stdlib:{name}")
    kv_len, page, d = 1500, 16, 128
    q, k, v = _ramp_inputs(1, kv_len, d, torch.bfloat16, seed=7)
    pages = -(-kv_len // page)
    cache = torch.zeros(pages, 2, page, HKV, d, dtype=k.dtype, device="cuda")
    for i, x in enumerate((k, v)):
        padded = torch.zeros(pages * page, HKV, d, dtype=x.dtype, device="cuda")
        padded[:kv_len] = x
        cache[:, i] = padded.view(pages, page, HKV, d)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, kv_layout="NHD")
    i32 = dict(dtype=torch.int32)
    wrapper.plan(
        torch.tensor([0, pages], **i32), torch.arange(pages, **i32),
        torch.tensor([kv_len - (pages - 1) * page], **i32), HQ, HKV, d, page, dtype=q.dtype,
    )  # fmt: skip
    params = PARAMS[name]
    o, lse = wrapper.run(q, cache, return_lse=True, **params)
    _check(variant, q, k, v, o, lse, params)


@pytest.mark.parametrize("backend", ["sm90", "fa2"])
def test_prefill_jump_past_the_exp2_range(backend):
    """Any reference max gives exact results while the weights stay finite, and a work item
    of the ramp above spans a few steps only, so a move the vote missed there would still pass.
    A jump of 144 log2 units inside the keys makes a missed move overflow the weights (the
    output is then not finite)."""
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs an sm_90 GPU")
    variant = attnc.load("stdlib:causal")
    q, k, v = _ramp_inputs(777, 1500, 128, torch.bfloat16, seed=3, jump=True)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend)
    _check(variant, q, k, v, o, lse, {})
