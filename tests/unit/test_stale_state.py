"""A long-lived wrapper against a fresh one (found by a stateful differential test; CPU,
launches stubbed). Before: another wrapper's ``out=`` written over a planned tensor counted as
attnc's own write, so the planned tensor's stamp followed it and run() launched on a work list
cut for the old values; ``0.0`` and ``-0.0`` were one key of the call memos and of the
derived-value check (a call launched the other zero's struct; a value the check refuses
passed after the other zero had); a prefill plan() whose last params had the same metadata
skipped the negative-bit check."""

from __future__ import annotations

import struct

import pytest
import torch

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import (  # noqa: F401
    _qkv,
    _ragged_plan,
    _Recorder,
    _wrapper,
    cpu_run,
)

WRITTEN = "param 'window': run\\(\\) was given the planned tensor, written since plan\\(\\)"
# t = +0.0: 1/t = inf, causal attention; t = -0.0: 1/t = -inf, every key masked.
INVERSE_MASK = "variant inv { param t: f32 = 1.0; mask = kv_idx <= q_pos && 1.0 / t > 0.0; }"
# t = -0.0: exp(1/t) = 0, in range; t = +0.0: exp(1/t) = inf, refused by the derived check.
INVERSE_SCALE = "variant inv_scale { param t: f32 = 1.0; score = score * exp(1.0 / t); }"


def _source_wrapper(source: str, variant=None) -> tuple[BatchPrefillWrapper, _Recorder]:
    variant = variant or attnc.load(source=source)
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8, device="cpu"))
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    return w, recorder


def test_another_wrappers_out_over_a_planned_tensor_is_a_write(cpu_run) -> None:  # noqa: F811
    planned, _ = _wrapper("per_request_window")
    other, _ = _wrapper("causal")
    arena = torch.zeros(1 << 20, dtype=torch.uint8)
    window = arena[:8].view(torch.int32)
    window.copy_(torch.tensor([3, 100], dtype=torch.int32))
    total_q, total_kv = _ragged_plan(planned, params={"window": window})
    _ragged_plan(other)
    q, k, v = _qkv(total_q, total_kv)
    planned.run(q, (k, v), window=window)
    out = arena[: q.numel() * 2].view(torch.bfloat16).view(q.shape)  # over window's bytes
    other.run(q, (k, v), out=out)  # its checks see only its own params
    with pytest.raises(ValueError, match=WRITTEN):
        planned.run(q, (k, v), window=window)


def test_another_wrappers_workspace_copy_over_a_planned_tensor_is_a_write(cpu_run) -> None:  # noqa: F811
    planned, _ = _wrapper("per_request_window")
    arena = torch.zeros(1 << 22, dtype=torch.uint8)
    window = arena[:8].view(torch.int32)
    window.copy_(torch.tensor([3, 100], dtype=torch.int32))
    total_q, total_kv = _ragged_plan(planned, params={"window": window})
    variant = attnc.load("stdlib:causal")
    recorder = _Recorder(variant)
    other = BatchPrefillWrapper(variant, arena)  # a workspace holding window's bytes
    other._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    other._host_workspace = None  # plan() copies with torch's copy_, as into a CUDA workspace
    _ragged_plan(other)
    q, k, v = _qkv(total_q, total_kv)
    with pytest.raises(ValueError, match=WRITTEN):
        planned.run(q, (k, v), window=window)


def _float_bits(call: dict) -> bytes:
    return call["params_bytes"][:4]


def test_the_call_memos_tell_the_zeros_apart(cpu_run, cpu_decode) -> None:  # noqa: F811
    variant = attnc.load(source=INVERSE_MASK)
    q, k, v = (torch.randn(4, 2, 64, dtype=torch.float64) for _ in "qkv")
    assert variant.reference(q, k, v, t=0.0).abs().sum() > 0
    assert variant.reference(q, k, v, t=-0.0).abs().sum() == 0
    w, recorder = _source_wrapper(INVERSE_MASK, variant)
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    for t in (0.0, -0.0, 0.0):  # the later calls would be memo hits of the first
        w.run(q, (k, v), t=t)
        assert _float_bits(recorder.calls[-1]) == struct.pack("<f", t)
    d = cpu_decode("sigmoid")
    dq, cache = _inputs()
    for bias in (0.0, -0.0, 0.0):
        d.run(dq, cache, bias=bias)
        assert _float_bits(d._module.calls[-1]) == struct.pack("<f", bias)


def test_the_derived_value_check_tells_the_zeros_apart(cpu_run) -> None:  # noqa: F811
    variant = attnc.load(source=INVERSE_SCALE)
    a, _ = _source_wrapper(INVERSE_SCALE, variant)
    b, recorder = _source_wrapper(INVERSE_SCALE, variant)  # no call memo between the two
    total_q, total_kv = _ragged_plan(a)
    _ragged_plan(b)
    q, k, v = _qkv(total_q, total_kv)
    a.run(q, (k, v), t=-0.0)  # exp(-inf) = 0: in range
    with pytest.raises(ValueError, match="not finite"):
        b.run(q, (k, v), t=0.0)
    assert recorder.calls == []


def test_plan_checks_the_negative_bit_after_a_plan_of_the_same_metadata(cpu_run) -> None:  # noqa: F811
    w, _ = _wrapper("per_request_window")
    _ragged_plan(w, params={"window": torch.tensor([3, 100], dtype=torch.int32)})
    negated = torch._neg_view(torch.tensor([-3, -100], dtype=torch.int32))
    with pytest.raises(ValueError, match="negative bit"):
        _ragged_plan(w, params={"window": negated})
