"""On the GPU: a planned tensor param, the workspace and ``out`` cut from one allocation (the
plan's copy into the workspace and the ``out=`` version bump are attnc's own writes: runs
stay accepted and correct against the float64 reference); tensors made under
``torch.inference_mode``; fake tensors refused before any launch (the context still works
after); ``plan()`` under a meta default device; the reference under ``torch.autocast``."""

from __future__ import annotations

import pytest
import torch
from batch_check import check_batch, offsets
from torch._subclasses.fake_tensor import FakeTensorMode

import attnc
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 8, 2, 128
Q_LENS, KV_LENS = [17, 300, 64], [17, 700, 2049]
WORKSPACE = 64 << 20
I32 = dict(dtype=torch.int32, device="cpu")


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(Q_LENS), HQ, D, generator=gen).to("cuda", torch.bfloat16)
    k, v = (
        torch.randn(sum(KV_LENS), HKV, D, generator=gen).to("cuda", torch.bfloat16) for _ in "kv"
    )
    return q, k, v


# Made here, on the CPU: plan() below also runs under a meta default device.
QO_INDPTR = torch.tensor(offsets(Q_LENS), dtype=torch.int32, device="cpu")
KV_INDPTR = torch.tensor(offsets(KV_LENS), dtype=torch.int32, device="cpu")


def _plan(w: BatchPrefillWrapper, params=None) -> None:
    w.plan(QO_INDPTR, KV_INDPTR, HQ, HKV, D, params=params)


@pytest.mark.parametrize("backend", ["fa2", "sm90"])
def test_a_planned_tensor_workspace_and_out_in_one_allocation(backend: str) -> None:
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs sm_90")
    variant = attnc.load("stdlib:per_request_window")
    q, k, v = _inputs()
    out_bytes = q.numel() * 2
    arena = torch.zeros(4096 + WORKSPACE + out_bytes, dtype=torch.uint8, device="cuda")
    window = arena[:16].view(torch.int32)[: len(Q_LENS)]
    window.copy_(torch.tensor([5, 400, 1000], **I32))
    workspace = arena[4096 : 4096 + WORKSPACE]
    out = arena[4096 + WORKSPACE :].view(torch.bfloat16).view(q.shape)
    w = BatchPrefillWrapper(variant, workspace, backend=backend)
    try:
        _plan(w, {"window": window})  # its copy into the workspace moves window's version
    except ValueError as err:
        if backend == "sm90" and "cannot serve" in str(err):
            pytest.skip(str(err))
        raise
    for _ in range(2):  # a checked call, then a remembered one
        o, lse = w.run(q, (k, v), out=out, return_lse=True, window=window)
        assert o.data_ptr() == out.data_ptr()
    check_batch(
        variant, q, k, v, out, lse, Q_LENS, KV_LENS, lambda i: {"window": window[i : i + 1]}
    )
    window.add_(0)  # a write by torch still counts
    with pytest.raises(ValueError, match="written since plan"):
        w.run(q, (k, v), window=window)


def test_inference_tensors_and_a_meta_default_device() -> None:
    variant = attnc.load("stdlib:per_request_window")
    q, k, v = _inputs(1)
    w = BatchPrefillWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    window = torch.tensor([5, 400, 1000], **I32).cuda()
    _plan(w, {"window": window})
    want = w.run(q, (k, v), window=window)
    with torch.inference_mode():
        inference_window = window.clone()
        _plan(w, {"window": inference_window})
        got = w.run(q, (k, v), window=inference_window)
    assert torch.equal(got, want)
    with torch.device("meta"):
        _plan(w, {"window": window})
    assert torch.equal(w.run(q, (k, v), window=window), want)


def test_fake_tensors_are_refused_before_a_launch() -> None:
    variant = attnc.load("stdlib:causal")
    q, k, v = _inputs(2)
    w = BatchPrefillWrapper(variant, torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"))
    _plan(w)
    want = w.run(q, (k, v))
    mode = FakeTensorMode()
    with pytest.raises(ValueError, match="^q: a fake tensor"):
        w.run(mode.from_tensor(q), (k, v))
    with pytest.raises(ValueError, match="^q: a fake tensor"):
        variant.prefill(mode.from_tensor(q[:17]), k[:17], v[:17])
    torch.cuda.synchronize()  # nothing read address 0
    assert torch.equal(w.run(q, (k, v)), want)


def test_the_reference_under_cuda_autocast() -> None:
    variant = attnc.load("stdlib:alibi")
    q, k, v = (t[:64].float() for t in _inputs(3))
    slopes = torch.full((HQ,), 0.25, device="cuda")
    want = variant.reference(q, k, v, slopes=slopes)
    with torch.autocast("cuda"):  # float16 einsums before
        got = variant.reference(q, k, v, slopes=slopes)
    assert torch.equal(got, want)
