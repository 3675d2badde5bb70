"""BatchPrefillWrapper.run()'s call memo, on the CPU with a recording launcher: a repeated call
of a plan launches the same argument struct as the fully checked call would, with its own
addresses; plan() empties the memo; the checks that must run per call still do."""

from __future__ import annotations

import ctypes

import pytest
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.checks import tensors
from attnc.runtime.wrappers import prefill_ctas, prefill_launch, prefill_run
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

HQ, HKV, D = 4, 2, 64
# Addresses that differ between two calls of the same arguments: the tensors', and the host
# copy of the params struct (each checked call packs its own; its bytes, `params_bytes`, are
# compared instead). Comparing that address made the paged test pass or fail on whether the
# allocator reused a freed block, which depended on the tests run before it.
POINTERS = ("q", "k", "v", "o", "lse", "variant_params")


class _Recorder:
    """Stands in for a PrefillModule: records each launch's struct and params bytes."""

    module_id = "recorder"

    def __init__(self, variant):
        self.ir = variant.ir
        self.params_type = abi.params_struct(variant.ir.params)
        self.calls: list[dict] = []

    def launch(self, args, stream):
        fields = {name: getattr(args, name) for name, _ in abi.AttncPrefillArgs._fields_}
        fields["params_bytes"] = ctypes.string_at(args.variant_params, args.variant_params_size)
        self.calls.append(fields)


@pytest.fixture
def cpu_run(monkeypatch):
    """run()'s device checks for CPU tensors, the module a recorder, the stream 0; counts
    the data-tensor checks."""
    checks = [0]
    check = tensors.check_data_tensor

    def counted(name, t, shape, device_type="cuda"):
        checks[0] += 1
        return check(name, t, shape, "cpu")

    ragged, paged = prefill_run.ragged_kv, prefill_run.paged_kv
    monkeypatch.setattr(tensors, "check_data_tensor", counted)
    monkeypatch.setattr(tensors, "same_device_index", lambda a, b: True)
    monkeypatch.setattr(prefill_run, "ragged_kv", lambda kv, h, d, dev: ragged(kv, h, d, "cpu"))
    monkeypatch.setattr(
        prefill_run, "paged_kv", lambda kv, lay, p, h, d, dev: paged(kv, lay, p, h, d, "cpu")
    )
    monkeypatch.setattr(prefill_launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(prefill_ctas, "device_ctas", lambda *a, **k: 8)
    return checks


def _wrapper(name: str, layout: str = "NHD") -> tuple[BatchPrefillWrapper, _Recorder]:
    variant = attnc.load(f"stdlib:{name}")
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8), kv_layout=layout)
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    return w, recorder


def _ragged_plan(w: BatchPrefillWrapper, lens=(5, 9), **kw) -> tuple[int, int]:
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    w.plan(indptr, indptr, HQ, HKV, D, **kw)
    return int(indptr[-1]), int(indptr[-1])


def _qkv(total_q: int, total_kv: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total_q, HQ, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(total_kv, HKV, D, generator=g).to(torch.bfloat16) for _ in "kv")
    return q, k, v


def _without_pointers(call: dict) -> dict:
    return {n: x for n, x in call.items() if n not in POINTERS}


def _checked_twin(w: BatchPrefillWrapper, recorder: _Recorder, *args, **kw) -> dict:
    """The struct a fully checked call with these arguments launches."""
    w._memo.clear()
    w.run(*args, **kw)
    return recorder.calls[-1]


def test_a_repeated_call_launches_the_checked_struct_with_its_own_addresses(cpu_run) -> None:
    w, rec = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    out = torch.empty_like(q)
    w.run(q, (k, v), out=out, return_lse=True)
    checks = cpu_run[0]
    q2, k2, v2 = _qkv(tq, tkv, seed=1)  # another layer: other tensors, the same shapes
    out2 = torch.empty_like(q2)
    o2, lse2 = w.run(q2, (k2, v2), out=out2, return_lse=True)
    assert cpu_run[0] == checks  # answered by the memo: no tensor was checked again
    hit = rec.calls[-1]
    assert o2 is out2
    assert (hit["q"], hit["k"], hit["v"], hit["o"], hit["lse"]) == (
        q2.data_ptr(), k2.data_ptr(), v2.data_ptr(), out2.data_ptr(), lse2.data_ptr()
    )  # fmt: skip
    twin = _checked_twin(w, rec, q2, (k2, v2), out=out2, return_lse=True)
    # The params struct's host copy is each call's own (its bytes are compared); the LSE new.
    own = ("lse", "variant_params")
    assert {k: x for k, x in hit.items() if k not in own} == {
        k: x for k, x in twin.items() if k not in own
    }


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["cache", "tuple"])
def test_paged_calls_from_the_memo_point_at_this_calls_cache(cpu_run, layout, form) -> None:
    w, rec = _wrapper("softcap", layout)
    page, pages = 4, 9
    qo = torch.tensor([0, 3, 10], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    ids = torch.tensor([8, 1, 3, 0, 6], dtype=torch.int32)
    last = torch.tensor([3, 2], dtype=torch.int32)
    w.plan(qo, kv_indptr, HQ, HKV, D, kv_indices=ids, kv_last_page_len=last, page_size=page)
    inner = (page, HKV) if layout == "NHD" else (HKV, page)

    def cache(seed):
        c = torch.randn(pages, 2, *inner, D, generator=torch.Generator().manual_seed(seed))
        return c.to(torch.bfloat16)

    def kv_of(c):
        return c if form == "cache" else (c[:, 0].contiguous(), c[:, 1].contiguous())

    q = _qkv(10, 1)[0]
    w.run(q, kv_of(cache(0)), cap=20.0)
    kv = kv_of(cache(1))
    w.run(q, kv, cap=20.0)
    hit = rec.calls[-1]
    k, v = (kv[:, 0], kv[:, 1]) if form == "cache" else kv
    assert (hit["k"], hit["v"]) == (k.data_ptr(), v.data_ptr())
    twin = _checked_twin(w, rec, q, kv, cap=20.0)
    assert _without_pointers(hit) == _without_pointers(twin)
    assert (twin["k"], twin["v"]) == (hit["k"], hit["v"])


def test_params_are_keyed_by_value_and_tensor_identity(cpu_run) -> None:
    w, rec = _wrapper("alibi")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    w.run(q, (k, v), slopes=slopes)
    other = slopes * 2
    w.run(q, (k, v), slopes=other)  # another tensor: checked again, its address packed
    packed = ctypes.c_void_p.from_buffer_copy(rec.calls[-1]["params_bytes"][:8]).value
    assert packed == other.data_ptr()
    w.run(q, (k, v), slopes=slopes)
    assert rec.calls[-1]["params_bytes"] == rec.calls[0]["params_bytes"]
    assert len(w._memo) == 2

    w2, rec2 = _wrapper("softcap")
    _ragged_plan(w2)
    for cap in (30.0, 20.0, 30.0):
        w2.run(q, (k, v), cap=cap)
    caps = [ctypes.c_float.from_buffer_copy(c["params_bytes"][:4]).value for c in rec2.calls]
    assert caps == [30.0, 20.0, 30.0]


def test_plan_empties_the_memo_so_plan_dependent_checks_run_again(cpu_run) -> None:
    w, _ = _wrapper("causal")
    tq, tkv = _ragged_plan(w, (5, 9))
    q, k, v = _qkv(tq, tkv)
    w.run(q, (k, v))
    assert len(w._memo) == 1
    _ragged_plan(w, (6, 9))  # one more query and key token
    assert not w._memo
    with pytest.raises(ValueError, match=r"q: expected shape \[15, 4, 64\], got \[14, 4, 64\]"):
        w.run(q, (k, v))


def test_out_overlapping_q_is_refused_on_a_repeated_call(cpu_run) -> None:
    w, _ = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    both = torch.empty(2, tq, HQ, D, dtype=torch.bfloat16)
    w.run(both[0], (k, v), out=both[1])
    with pytest.raises(ValueError, match="out: overlaps q"):
        w.run(both[0], (k, v), out=both[0])


def test_a_planned_tensor_written_since_plan_is_refused_on_a_repeated_call(cpu_run) -> None:
    w, _ = _wrapper("per_request_window")
    window = torch.tensor([3, 100], dtype=torch.int32)
    tq, tkv = _ragged_plan(w, params={"window": window})
    q, k, v = _qkv(tq, tkv)
    w.run(q, (k, v), window=window)
    w.run(q, (k, v), window=window)
    window.add_(1)
    with pytest.raises(ValueError, match="written since plan"):
        w.run(q, (k, v), window=window)


def test_k_and_v_of_other_strides_are_copied_and_never_remembered(cpu_run) -> None:
    w, rec = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, _ = _qkv(tq, tkv)
    v = torch.empty(HKV, tkv, D, dtype=torch.bfloat16).transpose(0, 1)  # other strides
    v.copy_(k)
    w.run(q, (k, v))
    assert not w._memo
    assert rec.calls[-1]["v"] != v.data_ptr()  # launched on a contiguous copy


def test_variant_prefill_is_not_memoised(cpu_run, monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(prefill_run.prefill_calls, "remember", lambda *a: seen.append(a) or None)
    w, _ = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    w._run_checked(q, w._kv_views((k, v)), None, False, {})
    assert not seen and not w._memo


def test_a_scalar_given_to_plan_that_the_mask_does_not_read_is_kept(cpu_run) -> None:
    """plan(params={"cap": 30.0}) checked the soft-cap and dropped it: run() without it
    launched the default cap 50, and run(cap=20.0) was taken, without a word."""
    w, rec = _wrapper("softcap")
    tq, tkv = _ragged_plan(w, params={"cap": 30.0})
    q, k, v = _qkv(tq, tkv)
    with pytest.raises(
        ValueError, match=r"param 'cap' is 50.0 in run\(\), but plan\(\) was given 30.0"
    ):
        w.run(q, (k, v))
    with pytest.raises(ValueError, match="param 'cap' is 20.0 in run"):
        w.run(q, (k, v), cap=20.0)
    assert rec.calls == []
    w.run(q, (k, v), cap=30.0)
    assert ctypes.c_float.from_buffer_copy(rec.calls[-1]["params_bytes"][:4]).value == 30.0
    _ragged_plan(w)  # planned again without it: run() takes any value
    w.run(q, (k, v), cap=20.0)
    assert ctypes.c_float.from_buffer_copy(rec.calls[-1]["params_bytes"][:4]).value == 20.0


def _cap_that_plans(w: BatchPrefillWrapper) -> float:
    """A ``cap`` whose conversion (caller code ``run()`` runs) plans ``w`` over 8000 tokens."""
    big = torch.tensor([0, 4000, 8000], dtype=torch.int32)

    class Cap(float):
        def __float__(self) -> float:
            w.plan(big, big, HQ, HKV, D)
            return 30.0

    return Cap(30.0)


def test_plan_from_a_param_conversion_inside_run_launches_nothing(cpu_run) -> None:
    """A param's ``__float__`` planning another batch on the same wrapper during ``run()``:
    the 14-row q checked against the first plan was launched with the second plan's 1000
    work items (8000 tokens); now nothing is launched, and the wrapper runs its new plan."""
    w, rec = _wrapper("softcap")
    _ragged_plan(w)
    q, k, v = _qkv(14, 14)
    with pytest.raises(RuntimeError, match=r"^attnc: BatchPrefillWrapper\.run\(\): plan\(\) of"):
        w.run(q, (k, v), cap=_cap_that_plans(w))
    assert rec.calls == []
    q, k, v = _qkv(8000, 8000)
    w.run(q, (k, v), cap=30.0)
    assert len(rec.calls) == 1


def test_a_plan_of_a_wrapper_sharing_the_workspace_during_run_launches_nothing(cpu_run) -> None:
    """A param's ``__float__`` planning another wrapper of the same workspace during
    ``run()`` overwrote the work lists the run then launched its own plan's offsets over."""
    w1, rec = _wrapper("softcap")
    w2 = BatchPrefillWrapper(w1.variant, w1._workspace)
    w2._module_choice = w1._module_choice  # type: ignore[method-assign]
    _ragged_plan(w1)
    q, k, v = _qkv(14, 14)
    with pytest.raises(RuntimeError, match=r"^BatchPrefillWrapper\.run\(\): workspace_buffer: "):
        w1.run(q, (k, v), cap=_cap_that_plans(w2))
    assert rec.calls == []
