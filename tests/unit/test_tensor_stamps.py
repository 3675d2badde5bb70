"""The stamps of planned tensors against attnc's own writes. Views of one allocation share
torch's version counter, so attnc's own writes into an allocation moved the version of a
planned tensor held in another part of it, and run() refused that tensor as "written since
plan()" though nothing wrote it: an ``out=`` write moved only the running wrapper's stamps
(another wrapper that had planned a tensor of the same allocation was refused), and plan()'s
copy of its lists into a workspace cut from the same allocation as a planned tensor was never
followed. A tensor made under ``torch.inference_mode`` (no version counter) gave torch's
"Inference tensors do not track version counter" from plan()."""

from __future__ import annotations

import pytest
import torch

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import BATCH, HKV, HQ, _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import (  # noqa: F401
    _qkv,
    _ragged_plan,
    _Recorder,
    _wrapper,
    cpu_run,
)

WRITTEN = "param 'window': run\\(\\) was given the planned tensor, written since plan\\(\\)"


def _arena_window() -> tuple[torch.Tensor, torch.Tensor]:
    arena = torch.zeros(1 << 20, dtype=torch.uint8)
    window = arena[:16].view(torch.int32)[:2]
    window.fill_(4)
    return arena, window


def _out_in(arena: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return arena[4096 : 4096 + q.numel() * 2].view(torch.bfloat16).view(q.shape)


def test_an_out_write_moves_the_stamps_of_every_wrapper(cpu_run) -> None:  # noqa: F811
    a, _ = _wrapper("per_request_window")
    b, b_rec = _wrapper("per_request_window")
    arena, window = _arena_window()
    total_q, total_kv = _ragged_plan(a, params={"window": window})
    _ragged_plan(b, params={"window": window})
    q, k, v = _qkv(total_q, total_kv)
    a.run(q, (k, v), out=_out_in(arena, q), window=window)
    b.run(q, (k, v), window=window)  # refused before: A's bump moved window's version
    assert len(b_rec.calls) == 1
    window.add_(0)  # a write by torch still counts, for both
    for w in (a, b):
        with pytest.raises(ValueError, match=WRITTEN):
            w.run(q, (k, v), window=window)


def _causal_and_windowed():
    """A causal wrapper, one planned with a ``window`` cut from ``arena``, and inputs."""
    a, _ = _wrapper("causal")
    b, _ = _wrapper("per_request_window")
    arena, window = _arena_window()
    total_q, total_kv = _ragged_plan(a)
    _ragged_plan(b, params={"window": window})
    return a, b, arena, window, _qkv(total_q, total_kv)


def test_an_out_write_of_a_wrapper_without_tensors_moves_anothers(cpu_run) -> None:  # noqa: F811
    a, b, arena, window, (q, k, v) = _causal_and_windowed()
    a.run(q, (k, v), out=_out_in(arena, q))
    b.run(q, (k, v), window=window)


def test_plans_copy_into_a_workspace_of_the_same_allocation(cpu_run) -> None:  # noqa: F811
    variant = attnc.load("stdlib:per_request_window")
    recorder = _Recorder(variant)
    arena = torch.zeros((1 << 22) + 4096, dtype=torch.uint8)
    w = BatchPrefillWrapper(variant, arena[4096:], kv_layout="NHD")
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    w._host_workspace = None  # the copy a CUDA workspace takes (torch's copy_)
    window = arena[:8].view(torch.int32)
    window.fill_(4)
    before = window._version
    total_q, total_kv = _ragged_plan(w, params={"window": window})
    assert window._version > before  # the copy moved the shared counter
    q, k, v = _qkv(total_q, total_kv)
    w.run(q, (k, v), window=window)  # refused before
    window.add_(0)
    with pytest.raises(ValueError, match=WRITTEN):
        w.run(q, (k, v), window=window)


def test_inference_tensors_plan_and_run(cpu_run) -> None:  # noqa: F811
    w, recorder = _wrapper("per_request_window")
    with torch.inference_mode():
        window = torch.full((2,), 4, dtype=torch.int32)
        total_q, total_kv = _ragged_plan(w, params={"window": window})
        q, k, v = _qkv(total_q, total_kv)
        w.run(q, (k, v), window=window)
        w.run(q, (k, v), out=torch.empty_like(q), window=window)
        other = torch.full((2,), 4, dtype=torch.int32)
        with pytest.raises(ValueError, match="another tensor object than plan"):
            w.run(q, (k, v), window=other)
        # plan() again with the same object: planned anew (no version to tell a write by)
        stamp = w._planned_mask.tensors["window"]
        assert stamp.version is None and stamp.tensor is window
        window.fill_(2)
        _ragged_plan(w, params={"window": window})
        assert w._planned_mask.tensors["window"] is not stamp
    assert len(recorder.calls) == 2


def test_a_write_by_torch_during_attncs_own_write_is_still_seen(cpu_run, monkeypatch) -> None:  # noqa: F811
    """A write by another thread while attnc bumps an allocation's version moves it by two:
    the stamp does not follow it (here the write is made from inside the bump)."""
    a, b, arena, window, (q, k, v) = _causal_and_windowed()
    bump = torch.autograd.graph.increment_version

    def bump_and_write(t: torch.Tensor) -> None:
        window.add_(0)
        bump(t)

    monkeypatch.setattr(torch.autograd.graph, "increment_version", bump_and_write)
    a.run(q, (k, v), out=_out_in(arena, q))
    with pytest.raises(ValueError, match=WRITTEN):
        b.run(q, (k, v), window=window)


def _decode_plan(w, window: torch.Tensor) -> None:
    indptr = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    w._commit_mask(w._mask_ranges({"window": window}, (indptr, HQ, HKV, 64, 1)))
    w._token_sizes = {"batch_size": BATCH}


def test_decode_with_an_inference_tensor_and_an_out_in_its_allocation(cpu_decode) -> None:  # noqa: F811
    w = cpu_decode("per_request_window")
    q, cache = _inputs()
    with torch.inference_mode():
        window = torch.full((BATCH,), 4, dtype=torch.int32)
        _decode_plan(w, window)  # torch's version-counter error before
        w.run(q, cache, window=window)
        w.run(q, cache, out=torch.empty_like(q), window=window)
        with pytest.raises(ValueError, match="another tensor object than plan"):
            w.run(q, cache, window=window.clone())
    arena = torch.zeros(1 << 16, dtype=torch.uint8)
    window = arena[:16].view(torch.int32)[:BATCH]
    window.fill_(4)
    _decode_plan(w, window)
    w.run(
        q,
        cache,
        out=arena[4096 : 4096 + q.numel() * 2].view(torch.bfloat16).view(q.shape),
        window=window,
    )
    w.run(q, cache, window=window)
    window.add_(0)
    with pytest.raises(ValueError, match=WRITTEN):
        w.run(q, cache, window=window)
    assert len(w._module.calls) == 4
