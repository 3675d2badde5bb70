"""Eager calls launch the kernels through ctypes, which autograd does not see: with an input
that requires grad, the output came back without a ``grad_fn`` and a loss built on it
dropped attention's part of the gradient silently. The output now carries a node whose
backward raises, naming the call (CPU runs with the launch stubbed)."""

from __future__ import annotations

import pytest
import torch

from attnc.runtime.wrappers.forward_only import forward_only
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import _qkv, _ragged_plan, _wrapper, cpu_run  # noqa: F401

NO_BACKWARD = r"attnc: {} has no backward .*torch\.no_grad\(\)"


def _backward_raises(o: torch.Tensor, call: str) -> None:
    assert o.requires_grad and type(o.grad_fn).__name__ == "_ForwardOnlyBackward"
    with pytest.raises(RuntimeError, match=NO_BACKWARD.format(call)):
        o.float().sum().backward()


def test_batch_prefill_output_refuses_backward(cpu_run) -> None:  # noqa: F811
    w, _ = _wrapper("causal")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    assert w.run(q, (k, v)).grad_fn is None  # nothing requires grad
    for call in (lambda: w.run(q.requires_grad_(), (k, v)), lambda: w.run(q, (k, v))):
        _backward_raises(call(), r"BatchPrefillWrapper\.run")  # the second: a memo hit
    o, lse = w.run(q, (k, v), return_lse=True)
    _backward_raises(lse, r"BatchPrefillWrapper\.run")
    with torch.no_grad():
        assert not w.run(q, (k, v)).requires_grad


def test_batch_prefill_key_and_param_tensors_count(cpu_run) -> None:  # noqa: F811
    w, _ = _wrapper("alibi")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    slopes = torch.rand(q.shape[1])
    assert w.run(q, (k, v), slopes=slopes).grad_fn is None
    _backward_raises(w.run(q, (k.requires_grad_(), v), slopes=slopes), r"BatchPrefillWrapper\.run")
    k.requires_grad_(False)
    _backward_raises(w.run(q, (k, v), slopes=slopes.requires_grad_()), r"BatchPrefillWrapper\.run")


def test_batch_decode_output_refuses_backward(cpu_decode) -> None:  # noqa: F811
    w = cpu_decode("causal")
    q, cache = _inputs()
    assert w.run(q, cache).grad_fn is None
    _backward_raises(w.run(q.requires_grad_(), cache), r"BatchDecodeWrapper\.run")
    with torch.inference_mode():
        assert not w.run(q.detach(), cache).requires_grad


def test_the_decorator_passes_mappings_and_results_through() -> None:
    @forward_only("demo")
    def run(q, params):
        return q.detach() * 2, q.detach()[:, 0]

    q = torch.randn(3, 2)
    params = {"slopes": torch.ones(2, requires_grad=True)}
    o, lse = run(q, params)
    assert torch.equal(o, q * 2)
    _backward_raises(o, "demo")
    assert run(q, {"slopes": torch.ones(2)})[0].grad_fn is None


def test_compiling_with_an_input_that_requires_grad_fails_by_name(cpu_run, monkeypatch) -> None:  # noqa: F811
    """As documented: torch traces the custom op's backward at compile time and refuses
    it, naming the op (the eager node above is not involved under torch.compile)."""
    from attnc.runtime.wrappers import prefill_launch

    w, recorder = _wrapper("causal")
    monkeypatch.setattr(prefill_launch, "module_by_id", lambda module_id: recorder)
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    compiled = torch.compile(lambda q, k, v: w.run(q, (k, v)), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"backward through attnc\.prefill\.default"):
        compiled(q.requires_grad_(), k, v)


def test_an_out_buffer_is_left_without_the_node(cpu_run) -> None:  # noqa: F811
    """The node was put on the caller's ``out=`` buffer itself: from then on it required
    grad, kept the input's graph alive and made every later call with plain tensors return
    an output whose backward raises. The node now sits on an alias of the buffer."""
    w, _ = _wrapper("causal")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    out = torch.empty_like(q)
    o = w.run(q.clone().requires_grad_(), (k, v), out=out)
    _backward_raises(o, r"BatchPrefillWrapper\.run")
    assert o.data_ptr() == out.data_ptr() and not out.requires_grad and out.grad_fn is None
    again = w.run(q, (k, v), out=out)
    assert again is out and again.grad_fn is None


def test_an_out_buffer_is_seen_written_by_autograd(cpu_run, cpu_decode) -> None:  # noqa: F811
    """``out=`` was written through its address: its version stayed, so a backward that had
    saved the buffer used the overwritten values without a word (torch's own ``out=`` ops
    bump it); an ``out`` that requires grad was taken (torch refuses it)."""
    w, _ = _wrapper("causal")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    x = torch.randn(q.shape, requires_grad=True)
    buf = (x * 1).to(q.dtype)
    loss = (buf * buf).float().sum()  # the product saves buf
    for _ in range(2):  # the second call: a memo hit
        before = buf._version
        w.run(q, (k, v), out=buf.detach())
        assert buf._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(ValueError, match=r"BatchPrefillWrapper\.run\(\): out: requires grad"):
        w.run(q, (k, v), out=torch.empty_like(q).requires_grad_())
    with torch.no_grad():
        w.run(q, (k, v), out=torch.empty_like(q).requires_grad_())  # torch's rule too
    d = cpu_decode("causal")
    dq, cache = _inputs()
    out = torch.empty_like(dq)
    d.run(dq, cache, out=out)
    assert out._version == 1
    with pytest.raises(ValueError, match=r"BatchDecodeWrapper\.run\(\): out: requires grad"):
        d.run(dq, cache, out=out.requires_grad_())


def test_out_in_one_buffer_with_a_planned_tensor_param(cpu_run) -> None:  # noqa: F811
    """Views of one allocation share torch's version counter: bumping ``out``'s version
    moved the planned ``window`` tensor's too, and the next run() refused it as "written
    since plan()" though nothing wrote it. A write by torch still counts."""
    w, rec = _wrapper("per_request_window")
    arena = torch.zeros(1 << 20, dtype=torch.uint8)
    window = arena[:16].view(torch.int32)[:2]
    window.fill_(4)
    total_q, total_kv = _ragged_plan(w, params={"window": window})
    q, k, v = _qkv(total_q, total_kv)
    out = arena[4096 : 4096 + q.numel() * 2].view(torch.bfloat16).view(q.shape)
    for _ in range(3):  # a checked call, then memo hits
        w.run(q, (k, v), out=out, window=window)
    assert out._version == window._version == 4  # fill_, then three runs
    window.add_(0)  # a write by torch
    with pytest.raises(ValueError, match="written since plan"):
        w.run(q, (k, v), out=out, window=window)
