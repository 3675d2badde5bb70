"""A view with torch's negative bit (the ``.imag`` of a conjugated complex tensor) holds the
negated values in memory; torch ops read it right, the kernels read its bytes as they are.
Such q/k/v/out/cache tensors and tensor params were taken, and the kernels computed with
the negated values; they are now refused by name."""

from __future__ import annotations

import pytest
import torch

import attnc
from attnc.runtime.checks import tensors
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import _qkv, _ragged_plan, _wrapper, cpu_run  # noqa: F401


def _negated_view(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    complex_dtype = torch.complex32 if dtype == torch.float16 else torch.complex64
    view = torch.randn(shape, dtype=complex_dtype).conj().imag
    assert view.is_neg() and view.dtype == dtype
    return view


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_a_data_tensor_with_the_negative_bit_is_refused() -> None:
    q = _negated_view((5, 4, 16), torch.float16)
    with pytest.raises(ValueError, match=r"^q: a view with torch's negative bit set"):
        tensors.check_data_tensor("q", q, (None, 4, 16), "cpu")
    tensors.check_data_tensor("q", q.resolve_neg(), (None, 4, 16), "cpu")


def test_a_tensor_param_with_the_negative_bit_is_refused() -> None:
    v = attnc.load("stdlib:alibi")
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    slopes = _negated_view((4,), torch.float32)
    with pytest.raises(ValueError, match=r"param 'slopes' .*negative bit set.*resolve_neg"):
        v.reference(q, k, k, slopes=slopes)
    resolved = slopes.resolve_neg()
    assert torch.equal(resolved, slopes) and not resolved.is_neg()
    assert torch.isfinite(v.reference(q, k, k, slopes=resolved)).all()


def test_a_repeated_call_with_a_negated_view_is_checked_again(cpu_run) -> None:  # noqa: F811
    """The call memo keyed q by shape, strides, dtype and device: a negated view of the
    same layout reused the first call's checks and was launched. It is checked again."""
    w, recorder = _wrapper("causal")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    w.run(q, (k, v))
    launched = len(recorder.calls)
    for args in ((torch._neg_view(q), (k, v)), (q, (k, torch._neg_view(v)))):
        with pytest.raises(ValueError, match=r"negative bit set"):
            w.run(*args)
    assert len(recorder.calls) == launched


def test_a_repeated_decode_call_with_a_negated_view_is_checked_again(cpu_decode) -> None:  # noqa: F811
    w = cpu_decode("causal")
    q, cache = _inputs()
    w.run(q, cache)
    with pytest.raises(ValueError, match=r"^q: a view with torch's negative bit set"):
        w.run(torch._neg_view(q), cache)


def test_merge_state_refuses_a_negated_state() -> None:
    from attnc.runtime.wrappers.merge import merge_state

    o, lse = torch.randn(4, 2, 8), torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"^lse_b: a view with torch's negative bit set"):
        merge_state(o, lse, o, torch._neg_view(lse))


def test_a_planned_tensor_param_with_the_negative_bit_is_refused() -> None:
    """plan()'s fast check (declared dtype, shape, device, contiguous) took a negated view of
    a tensor param, which run() then refused: plan() refuses it by name too."""
    from attnc.runtime.planning.plan_params import split_plan_params

    v = attnc.load("stdlib:per_request_window")
    window = torch.tensor([4, 8], dtype=torch.int32)
    sizes = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "batch_size": 2}
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"param 'window' .*negative bit set"):
        split_plan_params(v, {"window": torch._neg_view(-window)}, sizes=sizes, device=cpu)
    _, planned = split_plan_params(v, {"window": window}, sizes=sizes, device=cpu)
    assert planned["window"] is window
