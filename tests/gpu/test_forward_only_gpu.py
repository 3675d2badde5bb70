"""The eager calls' outputs carry a node whose backward raises when an input requires grad
(the kernels compute the forward pass only; autograd does not see a ctypes launch), with
the values of a call without grad; under torch.compile the custom ops raise on backward."""

import pytest
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 8, 2, 128


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("cuda", torch.bfloat16)


def _refuses_backward(o: torch.Tensor, call: str) -> None:
    assert o.requires_grad
    with pytest.raises(RuntimeError, match=f"attnc: {call} has no backward"):
        o.float().sum().backward()


def test_variant_prefill_and_batch_prefill():
    variant = attnc.load("stdlib:causal")
    q, k, v = _randn(64, HQ, D, seed=1), _randn(64, HKV, D, seed=2), _randn(64, HKV, D, seed=3)
    want = variant.prefill(q, k, v)
    got = variant.prefill(q.clone().requires_grad_(), k, v)
    assert torch.equal(got.detach(), want)
    _refuses_backward(got, r"Variant\.prefill")
    w = BatchPrefillWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    indptr = torch.tensor([0, 64], dtype=torch.int32)
    w.plan(indptr, indptr, HQ, HKV, D)
    want = w.run(q, (k, v))
    got = w.run(q, (k.clone().requires_grad_(), v))
    assert torch.equal(got.detach(), want)
    _refuses_backward(got, r"BatchPrefillWrapper\.run")


def test_batch_decode():
    variant = attnc.load("stdlib:causal")
    w = BatchDecodeWrapper(variant, torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
    page, pages = 16, 8
    cache = _randn(pages, 2, page, HKV, D, seed=4)
    w.plan(
        torch.tensor([0, 4, 8], dtype=torch.int32),
        torch.arange(8, dtype=torch.int32),
        torch.tensor([16, 5], dtype=torch.int32),
        HQ, HKV, D, page,
    )  # fmt: skip
    q = _randn(2, HQ, D, seed=5)
    want = w.run(q, cache)
    got = w.run(q.clone().requires_grad_(), cache)
    assert torch.equal(got.detach(), want)
    _refuses_backward(got, r"BatchDecodeWrapper\.run")
