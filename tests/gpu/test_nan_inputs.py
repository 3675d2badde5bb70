"""NaN in, NaN out, in the kernels as in the reference: a NaN in q, in a key a row can see, or
a NaN param gives that row NaN output and NaN LSE; rows that cannot see the NaN stay exact,
and a row that sees no key keeps output 0 and LSE -inf (``docs/runtime.md``, bad inputs).
Both prefill templates (FA2, and the Hopper one on sm_90), unsplit and split-KV (merge path),
and decode (unsplit and split requests)."""

import math

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 4, 2, 128
I32 = dict(dtype=torch.int32)
BACKENDS = ["fa2"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])


def _qkv(q_len, kv_len, seed=0, hq=HQ, hkv=HKV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, hq, D, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, hkv, D, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, hkv, D, generator=g).to("cuda", torch.bfloat16)
    return q, k, v


def _same_nan_rows(variant, q, k, v, backend, **params):
    """The kernel's NaN pattern equals the reference's, per (token, head) row, in O and LSE."""
    ref_o, ref_lse = variant.reference(q.float(), k.float(), v.float(), return_lse=True, **params)
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, **params)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    assert torch.equal(torch.isnan(o).all(-1), torch.isnan(ref_o).all(-1))
    assert torch.equal(torch.isnan(o).any(-1), torch.isnan(ref_o).any(-1))
    finite = ~torch.isnan(ref_lse)
    assert torch.equal(torch.isneginf(lse[finite]), torch.isneginf(ref_lse[finite]))
    return torch.isnan(ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_nan_in_q_is_one_nan_row(backend):
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(70, 200)
    q[33, 1, 7] = math.nan
    nan_rows = _same_nan_rows(variant, q, k, v, backend)
    assert nan_rows.sum() == 1 and nan_rows[33, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_nan_in_k_reaches_rows_that_see_it(backend):
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(70, 200)
    k[150, 0, 3] = math.nan  # KV head 0 feeds query heads 0 and 1; q_pos >= 150 see it
    nan_rows = _same_nan_rows(variant, q, k, v, backend)
    assert nan_rows[:, :2].sum() == 2 * (70 - 20) and not nan_rows[:, 2:].any()  # q_idx >= 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_nan_param(backend):
    variant = attnc.load("stdlib:softcap")
    q, k, v = _qkv(20, 64)
    assert _same_nan_rows(variant, q, k, v, backend, cap=math.nan).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_nan_in_k_through_the_split_kv_merge(backend):
    """One query head per KV head and a long KV: the tile is split over several chunks; the
    chunk holding the NaN key gives NaN partial rows and the merge keeps them NaN."""
    variant = attnc.load("stdlib:vanilla")
    q, k, v = _qkv(17, 4099, seed=2, hq=2, hkv=2)
    k[3000, 1, 0] = math.nan  # KV head 1 = query head 1, seen by every query
    nan_rows = _same_nan_rows(variant, q, k, v, backend)
    assert nan_rows[:, 1].all() and not nan_rows[:, 0].any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block", range(16))
def test_softcap_nan_key_in_any_column_block(backend, block):
    """A NaN key in any 8-key column block of a 128-key tile (soft-cap: its tanh, then the
    softmax) reaches exactly the rows that see it."""
    variant = attnc.load("stdlib:softcap")
    q, k, v = _qkv(64, 256, seed=5)
    key = 128 + 8 * block + 5
    k[key, 0, 1] = math.nan  # KV head 0: query heads 0 and 1; q_pos = q_idx + 192
    nan_rows = _same_nan_rows(variant, q, k, v, backend)
    assert nan_rows[:, :2].sum() == 2 * (64 - max(0, key - 192)) and not nan_rows[:, 2:].any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["causal", "softcap"])
def test_prefill_rows_without_keys_stay_empty_next_to_nan_rows(backend, name):
    variant = attnc.load(f"stdlib:{name}")
    q, k, v = _qkv(40, 20, seed=4)  # q_pos = q_idx - 20: the first 20 queries see no key
    k[5, 0, 0] = math.nan
    nan_rows = _same_nan_rows(variant, q, k, v, backend)
    assert not nan_rows[:20].any() and nan_rows[25:, :2].all()


@pytest.mark.parametrize("lens", [[40, 70, 5], [40, 9000, 5]])
def test_decode_nan_in_q_and_k(lens):
    """[40, 9000, 5]: the long request is split (merge kernel path)."""
    variant = attnc.load("stdlib:vanilla")
    page = 16
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], **I32)
    ids = torch.arange(int(indptr[-1]), **I32)
    last = torch.tensor([(n - 1) % page + 1 for n in lens], **I32)
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(int(indptr[-1]), 2, page, HKV, D, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens), HQ, D, generator=g).to("cuda", torch.bfloat16)
    q[0, 3, 0] = math.nan  # request 0, query head 3
    cache[int(indptr[1]) + 1, 0, 2, 0, 9] = math.nan  # request 1, KV head 0 (query heads 0-1)
    w = BatchDecodeWrapper(variant, torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, HQ, HKV, D, page)
    o, lse = w.run(q, cache, return_lse=True)
    expect = torch.zeros(len(lens), HQ, dtype=torch.bool)
    expect[0, 3] = expect[1, 0] = expect[1, 1] = True
    assert torch.equal(torch.isnan(lse).cpu(), expect)
    assert torch.equal(torch.isnan(o).all(-1).cpu(), expect)
    assert torch.isfinite(o[~expect.cuda()]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_nan_keys_past_a_range_never_reach_it(backend):
    """A NaN key at row 120 of request 0 and NaN K and V in the whole next request. The
    Hopper template loads the tail tile of a range ending at a multiple of 16 keys (request
    0's query tile [128, 192) ends at key 192) through TMA as a whole tile, reading the next
    request's rows, which S masks and P V skips; the FA2 template zero-fills them. Request 0's
    rows before the NaN key stay exact, the rows that see a NaN key are NaN."""
    variant = attnc.load("stdlib:causal")
    lens = [200, 48]
    q, k, v = _qkv(sum(lens), sum(lens), seed=5)
    k[120] = math.nan
    k[lens[0] :] = math.nan
    v[lens[0] :] = math.nan
    indptr = torch.tensor([0, lens[0], sum(lens)], **I32)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = attnc.BatchPrefillWrapper(variant, ws, backend=backend)
    w.plan(indptr, indptr, HQ, HKV, D, dtype=torch.bfloat16)
    o, lse = w.run(q, (k, v), return_lse=True)
    n = lens[0]
    ref_o, ref_lse = variant.reference(q[:n].float(), k[:n].float(), v[:n].float(), return_lse=True)
    torch.testing.assert_close(o[:120].float(), ref_o[:120], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[:120], ref_lse[:120], atol=2e-2, rtol=2e-2)
    assert torch.isnan(lse[120:]).all()


STRICT_ALIBI = """
variant strict_alibi {
    param slopes: tensor<f32>[num_qo_heads];
    score = score + slopes[qo_head] * (kv_idx - q_pos);
    mask = kv_idx < q_pos;
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_stepped_bias_with_infinite_and_nan_slopes(backend):
    """A bias linear in kv_idx (the Hopper template steps it from key to key) with slopes +inf,
    NaN, 0.5 and 0.25, under a mask that hides the key at distance 0. Slope +inf gives every
    visible key bias -inf: the reference's rows are empty (output 0, LSE -inf), and stepping
    the bias (-inf + inf) must not make them NaN. A NaN slope makes every row with a key NaN."""
    from attnc.codegen.functor import emit_functor
    from attnc.codegen.module import analysed

    variant = attnc.load(source=STRICT_ALIBI)
    assert "kBiasStep = true" in emit_functor(analysed(variant.ir))  # the bias is stepped
    q, k, v = _qkv(96, 96, seed=6)
    slopes = torch.tensor([math.inf, math.nan, 0.5, 0.25], device="cuda")
    nan_rows = _same_nan_rows(variant, q, k, v, backend, slopes=slopes)
    assert not nan_rows[:, 0].any() and nan_rows[1:, 1].all() and not nan_rows[:, 2:].any()
    o, lse = variant.prefill(q, k, v, return_lse=True, backend=backend, slopes=slopes)
    assert torch.isneginf(lse[:, 0]).all() and (o[:, 0] == 0).all()
    ref = variant.reference(q.double(), k.double(), v.double(), slopes=slopes)
    err = (o[1:, 2:].double() - ref[1:, 2:]).norm() / ref[1:, 2:].norm()
    assert err < 1e-2, err


KEY_BIAS = """
variant key_bias {
    param bias: tensor<f32>[kv_len];
    score = score + bias[kv_idx];
    mask = kv_idx <= q_pos;
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_staged_key_bias_with_nan_and_infinite_keys(backend):
    """A per-key bias, which both templates compute once per key into shared memory (key
    values): a NaN at key 150 makes exactly the rows that see it NaN; -inf at key 40 takes that
    key out of every row (the row of q_pos 40 that sees only keys 0..40 stays exact); the rest
    within the accuracy of the other rows."""
    variant = attnc.load(source=KEY_BIAS)
    assert "kHasKeyValues = true" in variant.cuda_source
    q, k, v = _qkv(300, 300, seed=7)
    bias = torch.randn(300, generator=torch.Generator().manual_seed(7)).cuda()
    bias[150] = math.nan
    bias[40] = -math.inf
    nan_rows = _same_nan_rows(variant, q, k, v, backend, bias=bias)
    assert nan_rows[150:].all() and not nan_rows[:150].any()
    o = variant.prefill(q, k, v, backend=backend, bias=bias)
    ref = variant.reference(q.double(), k.double(), v.double(), bias=bias)
    err = (o[:150].double() - ref[:150]).norm() / ref[:150].norm()
    assert err < 1e-2, err
