"""attnc under torch's global modes and stand-in tensors (CPU; launches stubbed).

Before: ``Variant.reference`` under ``torch.autocast`` ran its two einsums in 16 bits (errors
of 1e-2 against float64, silently); a numpy complex ``sm_scale`` lost its imaginary part; a
FakeTensor index tensor reached the host planner as a null pointer (a segfault), and a
FakeTensor q/k/v was launched with null pointers; ``torch.func.vmap`` over ``run()`` gave
torch's "Cannot access data pointer" naming no argument; ``plan()`` under a meta default
device failed in numpy (and a refused one left the planner's buffer on meta); numpy's
``np.True_`` for a bool param was "expected a bool, got bool"."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.checks.page_status import PageStatus
from attnc.runtime.wrappers.decode_plan_inputs import FastPathKey
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import PAGE, _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import (  # noqa: F401
    HKV,
    HQ,
    D,
    _qkv,
    _ragged_plan,
    _Recorder,
    cpu_run,
)

pytestmark = pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
FAKE_Q = r"^q: a fake tensor \(FakeTensorMode\) has no memory for attnc to read"


def _fp64_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    shift = k.shape[0] - q.shape[0]
    keep = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + shift
    p = torch.softmax(s.masked_fill(~keep, -torch.inf), dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)


def test_the_reference_keeps_its_numerics_under_autocast() -> None:
    variant = attnc.load("stdlib:causal")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(16, 4, 64, generator=gen)
    k, v = (torch.randn(32, 2, 64, generator=gen) for _ in "kv")
    want = _fp64_causal(q, k, v)
    plain = variant.reference(q, k, v)
    with torch.autocast("cpu"):  # bf16 einsums before: errors near 1e-2
        auto = variant.reference(q, k, v)
        assert torch.is_autocast_enabled("cpu")  # left as it was
    assert torch.equal(auto, plain)
    assert (auto.double() - want).abs().max() < 1e-5


def test_a_complex_sm_scale_is_refused() -> None:
    variant = attnc.load("stdlib:causal")
    q = torch.randn(4, 2, 64)
    for scale in (np.complex128(0.125 + 1j), np.complex64(0.125), 0.125 + 0j):
        with pytest.raises(ValueError, match="sm_scale: expected a float, got complex"):
            variant.reference(q, q, q, sm_scale=scale)


def test_a_numpy_bool_is_a_bool_param() -> None:
    source = "variant flip {\n  param on: bool = true;\n  mask = on ? kv_idx <= q_pos : true;\n}\n"
    variant = attnc.load(source=source)
    q = torch.randn(4, 2, 64, dtype=torch.float64)
    for flag in (True, False):
        want = variant.reference(q, q, q, on=flag)
        assert torch.equal(variant.reference(q, q, q, on=np.bool_(flag)), want)


def _wrapper(cuda_copy: bool = False) -> tuple[BatchPrefillWrapper, _Recorder]:
    variant = attnc.load("stdlib:causal")
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8, device="cpu"))
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    if cuda_copy:
        w._host_workspace = None  # plan() copies with torch's copy_, as into a CUDA workspace
    return w, recorder


def test_fake_index_tensors_are_refused_by_name(cpu_run) -> None:  # noqa: F811
    w, _ = _wrapper()
    indptr = torch.tensor([0, 5, 14], dtype=torch.int32)
    fake = FakeTensorMode().from_tensor(indptr)  # a segfault in the planner before
    with pytest.raises(
        ValueError, match=r"qo_indptr: a fake tensor \(FakeTensorMode\) has no memory"
    ):
        w.plan(fake, indptr, HQ, HKV, D)
    with pytest.raises(
        ValueError, match=r"kv_indptr: a fake tensor \(FakeTensorMode\) has no memory"
    ):
        w.plan(indptr, fake, HQ, HKV, D)


def test_fake_data_tensors_are_refused_not_launched(cpu_run, cpu_decode) -> None:  # noqa: F811
    w, recorder = _wrapper()
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    w.run(q, (k, v))  # remembered: a fake of the same metadata must not take its struct
    mode = FakeTensorMode()
    fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
    with pytest.raises(ValueError, match=FAKE_Q):
        w.run(fq, (k, v))
    with pytest.raises(ValueError, match=r"^k: a fake tensor"):
        w.run(q, (fk, fv))
    with mode, pytest.raises(ValueError, match=FAKE_Q):
        w.run(fq, (fk, fv))
    assert len(recorder.calls) == 1
    d = cpu_decode("causal")
    dq, cache = _inputs()
    d.run(dq, cache)
    d.run(dq, cache)  # a cached call
    with pytest.raises(ValueError, match=FAKE_Q):
        d.run(mode.from_tensor(dq), cache)
    with pytest.raises(ValueError, match=r"^kv.*a fake tensor"):
        d.run(dq, mode.from_tensor(cache))
    assert len(d._module.calls) == 2


def test_vmap_over_run_names_the_tensor(cpu_run) -> None:  # noqa: F811
    w, recorder = _wrapper()
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    with pytest.raises(
        ValueError, match=r"^q: a tensor inside a torch\.func transform \(vmap, grad\)"
    ):
        torch.func.vmap(lambda a: w.run(a, (k, v)))(torch.stack([q, q]))
    assert recorder.calls == []


@pytest.mark.parametrize("cuda_copy", [False, True])
def test_plan_under_a_meta_default_device(cpu_run, cuda_copy: bool) -> None:  # noqa: F811
    w, recorder = _wrapper(cuda_copy)
    small = torch.tensor([0, 5, 14], dtype=torch.int32)
    big = torch.tensor([0, 3000, 6000], dtype=torch.int32)  # grows the planner's buffer
    with torch.device("meta"):
        w.plan(small, small, HQ, HKV, D)
        w.plan(big, big, HQ, HKV, D)
    w.plan(small, small, HQ, HKV, D)
    q, k, v = _qkv(14, 14)
    w.run(q, (k, v))
    assert len(recorder.calls) == 1


def _alibi_wrapper() -> tuple[attnc.Variant, BatchPrefillWrapper, _Recorder]:
    """A CPU-workspace ALiBi wrapper whose launches the recorder counts."""
    variant = attnc.load("stdlib:alibi")
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8, device="cpu"))
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    return variant, w, recorder


def test_a_fake_param_or_workspace_is_refused(cpu_run) -> None:  # noqa: F811
    variant, w, recorder = _alibi_wrapper()
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    slopes = torch.full((HQ,), 0.5)
    w.run(q, (k, v), slopes=slopes)
    fake = FakeTensorMode().from_tensor(slopes)
    with pytest.raises(ValueError, match=r"^param 'slopes': a fake tensor"):
        w.run(q, (k, v), slopes=fake)
    assert len(recorder.calls) == 1
    workspace = FakeTensorMode().from_tensor(torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^workspace_buffer: a fake tensor"):
        BatchPrefillWrapper(variant, workspace)


def test_wrapper_subclasses_are_refused_for_what_they_are(cpu_run) -> None:  # noqa: F811
    """A subclass that wraps other tensors (torch's TwoTensor, as DTensor) has no memory of
    its own: its data pointer reads 0. The refusal blamed a freed storage ("its storage
    holds 16 bytes, fewer than the view addresses")."""
    from torch.testing._internal.two_tensor import TwoTensor

    variant, w, recorder = _alibi_wrapper()
    indptr = torch.tensor([0, 5, 14], dtype=torch.int32)
    words = "a TwoTensor, a tensor subclass that wraps other tensors, has no memory"
    with pytest.raises(ValueError, match=f"^qo_indptr: {words}"):
        w.plan(TwoTensor(indptr, indptr.clone()), indptr, HQ, HKV, D)
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    slopes = torch.full((HQ,), 0.5)
    with pytest.raises(ValueError, match=f"^param 'slopes': {words}"):
        w.run(q, (k, v), slopes=TwoTensor(slopes, slopes.clone()))
    with pytest.raises(ValueError, match=f"^q: {words}"):
        w.run(TwoTensor(q, q.clone()), (k, v), slopes=slopes)
    assert recorder.calls == []
    w.run(q, (k, v), slopes=torch.nn.Parameter(slopes, requires_grad=False))  # a subclass
    assert len(recorder.calls) == 1


def test_an_eager_call_checks_while_another_thread_compiles(cpu_run) -> None:  # noqa: F811
    """torch's compile flag is one for the process: while another thread compiled, an eager
    run() took the traced branches and launched a freed storage's null address."""
    variant, w, recorder = _alibi_wrapper()
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    slopes = torch.full((HQ,), 0.5)
    slopes.untyped_storage().resize_(0)
    in_backend, release = threading.Event(), threading.Event()

    def blocking_backend(graph, example_inputs):
        in_backend.set()
        release.wait(60)
        return graph

    compile_thread = threading.Thread(
        target=lambda: torch.compile(lambda x: x * 2, backend=blocking_backend)(torch.ones(3))
    )
    compile_thread.start()
    try:
        assert in_backend.wait(60)
        assert torch.compiler.is_compiling()  # the flag this thread sees, set by the other
        with pytest.raises(ValueError, match="^param 'slopes': its storage holds 0 bytes"):
            w.run(q, (k, v), slopes=slopes)
    finally:
        release.set()
        compile_thread.join()
    assert recorder.calls == []


def test_the_reference_still_takes_fake_tensors() -> None:
    variant = attnc.load("stdlib:alibi")
    with FakeTensorMode():
        q = torch.empty(8, 4, 64)
        out = variant.reference(q, q, q, slopes=torch.empty(4))
    assert out.shape == (8, 4, 64)


def _doc_wrapper(monkeypatch, seen: list[object]) -> BatchPrefillWrapper:
    """A doc_causal wrapper whose host map builder records the ``doc`` it was given."""
    variant = attnc.load("stdlib:doc_causal")
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8, device="cpu"))
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]

    def host_map(values, q_lens, kv_lens, tile, block):
        seen.append(values["doc"])
        return np.zeros(64, np.uint8)

    monkeypatch.setattr(BatchPrefillWrapper, "_map_builder", staticmethod(host_map))
    return w


def test_plan_refuses_fake_and_vmapped_params(cpu_run, monkeypatch) -> None:  # noqa: F811
    """plan() read them before (a fake ``doc`` reached the map builder with a null pointer, a
    fake ``window`` gave numpy's subclass error, a vmapped one torch's data-pointer error)."""
    seen: list[object] = []
    w = _doc_wrapper(monkeypatch, seen)
    indptr = torch.tensor([0, 5, 14], dtype=torch.int32)
    fake = FakeTensorMode().from_tensor(torch.zeros(14, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^param 'doc': a fake tensor"):
        w.plan(indptr, indptr, HQ, HKV, D, params={"doc": fake})
    assert seen == []
    w.plan(indptr, indptr, HQ, HKV, D, params={"doc": torch.zeros(14, dtype=torch.int32)})
    assert len(seen) == 1
    windowed = _wrapper()[0]
    windowed.variant = attnc.load("stdlib:per_request_window")
    windows = torch.tensor([[3, 4], [5, 6]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^param 'window': a tensor inside a torch\.func"):
        torch.func.vmap(
            lambda t: windowed.plan(indptr, indptr, HQ, HKV, D, params={"window": t}) or t
        )(windows)


def test_decode_plan_refuses_a_vmapped_page_table_on_its_fast_path(cpu_decode) -> None:  # noqa: F811
    d = cpu_decode("causal")
    d._fast = FastPathKey((HQ, HKV, 128, PAGE, 1, None, torch.bfloat16), 1, None)
    d._page_status = PageStatus(torch.device("cpu"))
    d._device_index = 0

    def native_step(*args: object) -> None:
        raise AssertionError("the planner was reached")

    d._native_step = native_step  # type: ignore[method-assign]
    indptrs = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32)
    ids, last = torch.tensor([0], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv_indptr: a tensor inside a torch\.func"):
        torch.func.vmap(lambda p: d.plan(p, ids, last, HQ, HKV, 128, PAGE) or p)(indptrs)


def test_a_compiled_reference_finds_its_module() -> None:
    """Dynamo imports the module of a function it inlines by name: the reference of
    ``score + x * float(kv_idx)`` calls a helper of its module, which was in no
    ``sys.modules``, and ``torch.compile`` of it failed with ModuleNotFoundError. The module
    is there while its variant lives."""
    import gc
    import sys

    v = attnc.load(source="variant a3 { param x: f32 = 0.5; score = score + x * float(kv_idx); }")
    q, k, vv = (torch.randn(n, 2, 16, dtype=torch.float64) for n in (5, 9, 9))
    torch.testing.assert_close(
        _compiled_reference(v, q, k, vv), v.reference(q, k, vv, x=2.0), rtol=0, atol=0
    )
    name = v.reference_module.__name__
    assert sys.modules[name] is v.reference_module
    del v
    gc.collect()
    assert name not in sys.modules


def _compiled_reference(v, q, k, vv) -> torch.Tensor:
    torch._dynamo.reset()
    try:
        return torch.compile(lambda a, b, c: v.reference(a, b, c, x=2.0), backend="eager")(q, k, vv)
    finally:
        torch._dynamo.reset()
