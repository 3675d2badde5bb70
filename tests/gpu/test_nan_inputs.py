"""NaN in, NaN out, in the kernels as in the reference: a NaN in q, in a key a row can see, or
a NaN param gives that row NaN output and NaN LSE; rows that cannot see the NaN stay exact,
and a row that sees no key keeps output 0 and LSE -inf (``docs/runtime.md``, bad inputs)."""

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


def _qkv(q_len, kv_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, HQ, D, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(kv_len, HKV, D, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(kv_len, HKV, D, generator=g).to("cuda", torch.bfloat16)
    return q, k, v


def _same_nan_rows(variant, q, k, v, **params):
    """The kernel's NaN pattern equals the reference's, per (token, head) row, in O and LSE."""
    ref_o, ref_lse = variant.reference(q.float(), k.float(), v.float(), return_lse=True, **params)
    o, lse = variant.prefill(q, k, v, return_lse=True, **params)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    assert torch.equal(torch.isnan(o).all(-1), torch.isnan(ref_o).all(-1))
    assert torch.equal(torch.isnan(o).any(-1), torch.isnan(ref_o).any(-1))
    finite = ~torch.isnan(ref_lse)
    assert torch.equal(torch.isneginf(lse[finite]), torch.isneginf(ref_lse[finite]))
    return torch.isnan(ref_lse)


def test_prefill_nan_in_q_is_one_nan_row():
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(70, 200)
    q[33, 1, 7] = math.nan
    nan_rows = _same_nan_rows(variant, q, k, v)
    assert nan_rows.sum() == 1 and nan_rows[33, 1]


def test_prefill_nan_in_k_reaches_rows_that_see_it():
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(70, 200)
    k[150, 0, 3] = math.nan  # KV head 0 feeds query heads 0 and 1; q_pos >= 150 see it
    nan_rows = _same_nan_rows(variant, q, k, v)
    assert nan_rows[:, :2].sum() == 2 * (70 - 20) and not nan_rows[:, 2:].any()  # q_idx >= 20


def test_prefill_nan_param():
    variant = attnc.load("stdlib:softcap")
    q, k, v = _qkv(20, 64)
    assert _same_nan_rows(variant, q, k, v, cap=math.nan).all()


def test_decode_nan_in_q_and_k():
    variant = attnc.load("stdlib:vanilla")
    page, lens = 16, [40, 70, 5]
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
