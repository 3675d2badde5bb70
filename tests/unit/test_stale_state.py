"""A long-lived wrapper against a fresh one (found by a stateful differential test; CPU,
launches stubbed). Before: another wrapper's ``out=`` written over a planned tensor counted as
attnc's own write, so the planned tensor's stamp followed it and run() launched on a work list
cut for the old values; ``0.0`` and ``-0.0`` were one key of the call memos and of the
derived-value check (a call launched the other zero's struct; a value the check refuses
passed after the other zero had), and ``run()``'s check against the plan's scalars took one
zero for the other (numpy's zeros were one key everywhere); a prefill plan() whose last params
had the same metadata skipped the negative-bit check; a tensor whose storage was freed reached
the planners and kernels with a null address."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning.mask_ranges import PlannedMask
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit import test_prefill_call_memo as memo
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_hostile_runs import _map_wrapper
from tests.unit.test_prefill_call_memo import cpu_run  # noqa: F401
from tests.unit.test_tensor_stamps import WRITTEN

HQ, HKV, D = memo.HQ, memo.HKV, memo.D
_qkv, _ragged_plan, _Recorder, _wrapper = (
    memo._qkv,
    memo._ragged_plan,
    memo._Recorder,
    memo._wrapper,
)
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


class _Float(float):
    """A float subclass, as a config library may hand one over."""


def test_the_plan_memo_tells_a_float_subclass_s_zeros_apart(cpu_run) -> None:  # noqa: F811
    """A subclass's 0.0 and -0.0 shared one key: the second plan() kept the first's mask,
    run(t=-0.0) was refused as "plan() was given 0.0", and run(t=0.0) launched."""
    w, recorder = _source_wrapper(INVERSE_MASK)
    _ragged_plan(w, params={"t": _Float(0.0)})
    total_q, total_kv = _ragged_plan(w, params={"t": _Float(-0.0)})
    q, k, v = _qkv(total_q, total_kv)
    w.run(q, (k, v), t=-0.0)
    assert _float_bits(recorder.calls[-1]) == struct.pack("<f", -0.0)
    with pytest.raises(ValueError, match="'t'"):
        w.run(q, (k, v), t=0.0)
    assert len(recorder.calls) == 1


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


DOC_INVERSE = """variant doc_inv {
    param doc: tensor<i32>[kv_len];
    param t: f32 = 1.0;
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos] && 1.0 / t > 0.0;
}"""


def test_run_with_the_other_zero_than_the_tile_map_was_built_for(monkeypatch) -> None:
    """The map built for t = -0.0 holds only EMPTY blocks; run(t=0.0) passed its check."""
    w = _map_wrapper(monkeypatch, DOC_INVERSE)
    doc = torch.arange(2, dtype=torch.int32).repeat_interleave(128)
    qo = torch.tensor([0, 256], dtype=torch.int32)
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc, "t": -0.0})
    with pytest.raises(
        ValueError, match="param 't' is 0.0 in run\\(\\), but plan\\(\\) was given -0.0"
    ):
        w._check_planned_values({"doc": doc, "t": 0.0})
    w._check_planned_values({"doc": doc, "t": -0.0})
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc, "t": float("nan")})
    w._check_planned_values({"doc": doc, "t": float("nan")})  # the same value given again


def test_numpy_zeros_of_two_signs_are_two_plans(monkeypatch) -> None:
    w = _map_wrapper(monkeypatch, DOC_INVERSE)
    seen: list[object] = []
    build = w._map_builder
    w._map_builder = lambda values, *a: (seen.append(values["t"]), build(values, *a))[1]
    doc = torch.arange(2, dtype=torch.int32).repeat_interleave(128)
    qo = torch.tensor([0, 256], dtype=torch.int32)
    for t in (np.float64(-0.0), np.float64(0.0)):  # the second was the first's memo hit
        w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc, "t": t})
    assert [math.copysign(1.0, t) for t in seen] == [-1.0, 1.0]
    assert math.copysign(1.0, w._planned_mask.values["t"]) == 1.0
    variant = attnc.load(source=INVERSE_SCALE)
    PlannedMask.from_plan_params(variant, {"t": np.float32(0.0)})
    planned = PlannedMask.from_plan_params(variant, {"t": np.float32(-0.0)})
    assert math.copysign(1.0, planned.values["t"]) == -1.0


def test_a_tensor_whose_storage_was_freed_is_refused_by_name(cpu_run) -> None:  # noqa: F811
    """A storage freed by resize_(0) leaves the view's shape and a null address."""
    w, recorder = _wrapper("causal")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    freed = q.clone()
    freed.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="^q: its storage holds 0 bytes, fewer than the view"):
        w.run(freed, (k, v))
    indptr = torch.tensor([0, 5, 14], dtype=torch.int32)
    freed_indptr = indptr.clone()
    freed_indptr.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="^qo_indptr: its storage holds 0 bytes"):
        w.plan(freed_indptr, indptr, HQ, HKV, D)
    assert recorder.calls == []


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_plan_again_reads_a_tensor_written_where_torch_does_not_count(cpu_run, how) -> None:  # noqa: F811
    """The documented remedy for a write torch does not count (``.data``, numpy): plan()
    again. Its params memo answered by the tensor's object and version, so the plan kept the
    old values (Variant.prefill, which plans tensor params on every call, likewise)."""
    w, _ = _wrapper("per_request_window")
    window = torch.tensor([16, 16], dtype=torch.int32)
    _ragged_plan(w, params={"window": window})
    assert w._planned_mask.program.per_req["window"].tolist() == [16, 16]
    if how == "data":
        window.data[0] = 1000
    else:
        window.numpy()[0] = 1000
    _ragged_plan(w, params={"window": window})
    assert w._planned_mask.program.per_req["window"].tolist() == [1000, 16]


def test_a_tensor_param_whose_storage_was_freed_is_refused_by_name(cpu_run) -> None:  # noqa: F811
    """plan() read a freed window through a null address (a segfault), and run() packed a
    freed slopes tensor's null address for the kernel."""
    windowed, _ = _wrapper("per_request_window")
    window = torch.tensor([3, 100], dtype=torch.int32)
    window.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="^param 'window': its storage holds 0 bytes"):
        _ragged_plan(windowed, params={"window": window})
    zero = torch._efficientzerotensor(2, dtype=torch.int32)  # no storage: its own words
    words = "^variant 'per_request_window': param 'window' .*: expected a dense tensor, got a "
    with pytest.raises(ValueError, match=words + "zero-tensor"):
        _ragged_plan(windowed, params={"window": zero})
    as_param = torch.nn.Parameter(zero, requires_grad=False)  # a subclass, but no wrapper
    with pytest.raises(ValueError, match=words + "zero-tensor"):
        _ragged_plan(windowed, params={"window": as_param})
    sparse = torch.nn.Parameter(torch.tensor([3, 100], dtype=torch.int32).to_sparse(), False)
    with pytest.raises(ValueError, match=words + "sparse_coo"):
        _ragged_plan(windowed, params={"window": sparse})
    w, recorder = _wrapper("alibi")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    slopes = torch.full((HQ,), 0.5)
    w.run(q, (k, v), slopes=slopes)
    slopes.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="^param 'slopes': its storage holds 0 bytes"):
        w.run(q, (k, v), slopes=slopes)
    assert len(recorder.calls) == 1


def test_the_op_bodies_packer_refuses_a_zero_tensor_param(cpu_run) -> None:  # noqa: F811
    """A custom op's body packs the params it is given without the param checks (they ran
    as the graph was traced): a zero tensor among them was packed as a null address."""
    w, recorder = _wrapper("alibi")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    zero = torch._efficientzerotensor(HQ, dtype=torch.float32)
    with pytest.raises(ValueError, match="^param 'slopes': expected a dense tensor, got a zero"):
        w._run_checked(q, w._kv_views((k, v)), None, False, {"slopes": zero})
    assert recorder.calls == []
