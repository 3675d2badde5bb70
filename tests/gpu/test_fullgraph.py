"""``torch.compile(fullgraph=True)`` of every user-facing call: ``Variant.prefill``,
``BatchPrefillWrapper.run``, ``BatchDecodeWrapper.run`` and ``merge_state``. Each must trace
without a graph break (fullgraph raises otherwise) and give the eager call's result bit for
bit (the compiled graph runs the same kernels through the attnc custom ops)."""

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.merge import merge_state
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 8, 2, 128
I32 = dict(dtype=torch.int32)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _randn(*shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("cuda", dtype)


def _equal(a, b):
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


@pytest.mark.parametrize(("name", "params"), [("softcap", {"cap": 30.0}), ("alibi", None)])
def test_variant_prefill_fullgraph(name, params):
    variant = attnc.load(f"stdlib:{name}")
    q, k, v = _randn(37, HQ, D, seed=1), _randn(300, HKV, D, seed=2), _randn(300, HKV, D, seed=3)
    if params is None:
        params = {"slopes": torch.rand(HQ, device="cuda")}

    def call(q, k, v):
        return variant.prefill(q, k, v, return_lse=True, **params)

    compiled = torch.compile(call, fullgraph=True)
    assert _equal(compiled(q, k, v), call(q, k, v))


def test_batch_prefill_run_fullgraph():
    variant = attnc.load("stdlib:sliding_window")
    q_lens, kv_lens = [5, 40, 17], [100, 40, 600]
    qo = torch.tensor([0, 5, 45, 62], **I32)
    kv = torch.tensor([0, 100, 140, 740], **I32)
    w = BatchPrefillWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qo, kv, HQ, HKV, D, params={"window": 64})
    q = _randn(sum(q_lens), HQ, D)
    k, v = _randn(sum(kv_lens), HKV, D, seed=1), _randn(sum(kv_lens), HKV, D, seed=2)
    out = torch.empty_like(q)

    def call(q, k, v, out):
        return w.run(q, (k, v), out=out, return_lse=True, window=64)

    eager = tuple(t.clone() for t in call(q, k, v, out))
    out.zero_()
    o, lse = torch.compile(call, fullgraph=True)(q, k, v, out)
    assert _equal((o, lse), eager) and torch.equal(out, eager[0])


def test_batch_prefill_fullgraph_checks_derived_values():
    """A compiled ``run()`` sees the cap as a symbol; the ``attnc::prefill`` op's body
    checks it: cap 3e38 (soft-cap's derived ``1.442695 * cap`` is inf in float32) is
    refused, cap 30 gives the eager result bit for bit."""
    variant = attnc.load("stdlib:softcap")
    qo = torch.tensor([0, 37], **I32)
    kv = torch.tensor([0, 300], **I32)
    w = BatchPrefillWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qo, kv, HQ, HKV, D)
    q, k, v = _randn(37, HQ, D, seed=1), _randn(300, HKV, D, seed=2), _randn(300, HKV, D, seed=3)

    def call(q, k, v, cap):
        return w.run(q, (k, v), cap=cap)

    compiled = torch.compile(call, fullgraph=True)
    assert torch.equal(compiled(q, k, v, 30.0), call(q, k, v, 30.0))
    with pytest.raises(ValueError, match=r"variant 'softcap': cap = 3e\+38"):
        compiled(q, k, v, 3e38)


def test_batch_decode_run_fullgraph():
    variant = attnc.load("stdlib:softcap")
    page, lens = 16, [33, 1, 200, 16]
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], **I32)
    ids = torch.randperm(int(indptr[-1]) + 4, generator=torch.Generator().manual_seed(0))
    ids = ids[: int(indptr[-1])].to(torch.int32)
    last = torch.tensor([(n - 1) % page + 1 for n in lens], **I32)
    cache = _randn(int(indptr[-1]) + 4, 2, page, HKV, D, seed=5)
    w = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, ids, last, HQ, HKV, D, page)
    q = _randn(len(lens), HQ, D, seed=6)

    def call(q, cache):
        return w.run(q, cache, return_lse=True, cap=20.0)

    eager = call(q, cache)
    assert _equal(torch.compile(call, fullgraph=True)(q, cache), eager)


def test_merge_state_fullgraph():
    oa, ob = _randn(9, HQ, D, seed=1), _randn(9, HQ, D, seed=2)
    la, lb = _randn(9, HQ, seed=3, dtype=torch.float32), _randn(9, HQ, seed=4, dtype=torch.float32)
    compiled = torch.compile(merge_state, fullgraph=True)
    assert _equal(compiled(oa, la, ob, lb), merge_state(oa, la, ob, lb))
