"""Two wrappers given one workspace tensor: plan() writes the work lists into the workspace
and run() reads them there, so A.plan(), B.plan(), A.run() launched A's call on B's lists
(its struct read B's qo_indptr) without a word. run() now refuses a workspace whose last plan
is another wrapper's; a wrapper planned again, or one with a workspace of its own, runs."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning import workspace_owner
from attnc.runtime.planning.workspace import CapacityError
from attnc.runtime.wrappers.decode_plan_inputs import FastPathKey
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import DIM, PAGE, _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _qkv, _Recorder, cpu_run  # noqa: F401

SHARED = "another wrapper's plan\\(\\) wrote its work lists into this workspace"


def _wrapper(workspace: torch.Tensor) -> tuple[BatchPrefillWrapper, _Recorder]:
    variant = attnc.load("stdlib:causal")
    recorder = _Recorder(variant)
    w = BatchPrefillWrapper(variant, workspace)
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    return w, recorder


def _plan(w: BatchPrefillWrapper, lens: list[int]) -> torch.Tensor:
    indptr = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32)
    w.plan(indptr, indptr, HQ, HKV, D)
    return indptr


def _launched_qo_indptr(recorder: _Recorder, batch: int) -> list[int]:
    call = recorder.calls[-1]
    raw = ctypes.string_at(call["qo_indptr"], 4 * (batch + 1))
    return np.frombuffer(raw, np.int32).tolist()


def test_a_workspace_planned_by_another_wrapper_is_refused(cpu_run) -> None:  # noqa: F811
    workspace = torch.empty(1 << 22, dtype=torch.uint8)
    (a, a_rec), (b, _) = _wrapper(workspace), _wrapper(workspace)
    a_indptr = _plan(a, [64, 64])
    _plan(b, [16] * 8)  # as many tokens: A's checks of q and kv pass
    q, k, v = _qkv(128, 128)
    with pytest.raises(RuntimeError, match=SHARED):
        a.run(q, (k, v))
    assert a_rec.calls == []
    _plan(a, [64, 64])  # planned again: its lists are back
    a.run(q, (k, v))
    assert _launched_qo_indptr(a_rec, 2) == a_indptr.tolist()


def test_wrappers_with_workspaces_of_their_own_run_in_any_order(cpu_run) -> None:  # noqa: F811
    (a, a_rec), (b, b_rec) = (_wrapper(torch.empty(1 << 22, dtype=torch.uint8)) for _ in "ab")
    a_indptr, b_indptr = _plan(a, [64, 64]), _plan(b, [16] * 8)
    q, k, v = _qkv(128, 128)
    for _ in range(2):  # the second call goes through run()'s call memo
        a.run(q, (k, v))
        b.run(q, (k, v))
        assert _launched_qo_indptr(a_rec, 2) == a_indptr.tolist()
        assert _launched_qo_indptr(b_rec, 8) == b_indptr.tolist()


def test_the_memo_of_a_repeated_call_does_not_skip_the_check(cpu_run) -> None:  # noqa: F811
    workspace = torch.empty(1 << 22, dtype=torch.uint8)
    (a, _), (b, _) = _wrapper(workspace), _wrapper(workspace)
    _plan(a, [64, 64])
    q, k, v = _qkv(128, 128)
    a.run(q, (k, v))  # remembered
    _plan(b, [64, 64])
    with pytest.raises(RuntimeError, match=SHARED):
        a.run(q, (k, v))


def test_overlapping_slices_of_one_buffer_are_one_workspace(cpu_run) -> None:  # noqa: F811
    """Workspaces were told apart by their first byte: two slices of one buffer that share
    bytes from different first bytes were two workspaces, and A.plan, B.plan, A.run launched
    A's call on the lists B wrote over A's."""
    buffer = torch.empty(3 << 21, dtype=torch.uint8)
    (a, a_rec), (b, _) = _wrapper(buffer[: 1 << 22]), _wrapper(buffer[1 << 21 :])
    _plan(a, [64, 64])
    _plan(b, [16] * 8)
    q, k, v = _qkv(128, 128)
    with pytest.raises(RuntimeError, match=SHARED):
        a.run(q, (k, v))
    assert a_rec.calls == []
    a_indptr = _plan(a, [64, 64])  # A's plan takes the bytes back from B
    a.run(q, (k, v))
    assert _launched_qo_indptr(a_rec, 2) == a_indptr.tolist()


def test_disjoint_slices_of_one_buffer_are_two_workspaces(cpu_run) -> None:  # noqa: F811
    buffer = torch.empty(1 << 23, dtype=torch.uint8)
    (a, a_rec), (b, b_rec) = _wrapper(buffer[: 1 << 22]), _wrapper(buffer[1 << 22 :])
    a_indptr, b_indptr = _plan(a, [64, 64]), _plan(b, [16] * 8)
    q, k, v = _qkv(128, 128)
    a.run(q, (k, v))
    b.run(q, (k, v))
    assert _launched_qo_indptr(a_rec, 2) == a_indptr.tolist()
    assert _launched_qo_indptr(b_rec, 8) == b_indptr.tolist()


def test_a_decode_wrapper_checks_its_workspace_too(cpu_decode) -> None:  # noqa: F811
    """The decode run() reads its plan's lists from the workspace the same way."""
    a, b = cpu_decode("causal"), cpu_decode("causal")
    key = ("cpu", -1, 12345, 12345 + 4096)
    a._workspace_key = b._workspace_key = key
    a._plan_token = workspace_owner.take(key, None)
    b._plan_token = workspace_owner.take(key, None)
    q, cache = _inputs()
    b.run(q, cache)
    with pytest.raises(RuntimeError, match="BatchDecodeWrapper.run\\(\\): workspace_buffer"):
        a.run(q, cache)


def test_a_workspace_entry_goes_with_the_wrappers_that_planned_there(cpu_run) -> None:  # noqa: F811
    """The registry kept one entry per workspace address ever planned, after the wrappers and
    their variants were gone: 2179 entries after 4000 Variant.prefill calls of varying
    lengths."""
    a, _ = _wrapper(torch.empty(1 << 22, dtype=torch.uint8))
    _plan(a, [64, 64])
    key = a._workspace_key
    assert key in workspace_owner._LAST_PLAN
    del a
    assert key not in workspace_owner._LAST_PLAN


class _RefusingPlanner:
    """The decode planner refusing a step before it writes anything (as a bad page table or
    a step beyond the wrapper's capacity is)."""

    stage_bytes = 1 << 20

    def step(self, *args):
        raise CapacityError("decode plan: needs 99999 work items, the wrapper holds 16384")


def _planned_decode(make, key):
    w = make("causal")
    w._workspace_key = key
    w._plan_token = workspace_owner.take(key, None)  # what a successful plan() leaves
    w._page_status = types.SimpleNamespace(pending=False)
    w.layout = types.SimpleNamespace(max_pages=1 << 20)
    w._device_index = 0
    w._fast = FastPathKey((HQ, HKV, DIM, PAGE, 1, None, torch.bfloat16), 1, None)
    return w


def test_a_refused_decode_plan_does_not_take_the_workspace(cpu_decode) -> None:  # noqa: F811
    """B.plan, A.plan, then B.plan refused before it wrote: B took the workspace's token at
    the start of its step, and B.run() launched B's old plan on A's lists."""
    key = ("cuda", 0, 0x7F0000000000, 0x7F0000100000)
    b = _planned_decode(cpu_decode, key)
    a = _planned_decode(cpu_decode, key)
    b._native = _RefusingPlanner()
    indptr = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    with pytest.raises(CapacityError):
        b.plan(indptr, torch.arange(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32),
               HQ, HKV, DIM, PAGE)  # fmt: skip
    q, cache = _inputs()
    with pytest.raises(RuntimeError, match="another wrapper's plan"):
        b.run(q, cache)
    a.run(q, cache)  # A's lists are intact


def test_a_workspace_taken_during_a_decode_run_launches_nothing(cpu_decode) -> None:  # noqa: F811
    """Caller code run by ``run()`` (a param's conversion) that makes another wrapper's plan
    the workspace's: the run had checked the workspace first, and launched over the other
    plan's lists."""
    a, b = cpu_decode("softcap"), cpu_decode("softcap")
    key = ("cpu", -1, 12345, 12345 + 4096)
    a._workspace_key = b._workspace_key = key
    a._plan_token = workspace_owner.take(key, None)
    launched = []
    module = a._module
    real_launch = module.launch
    module.launch = lambda *args: launched.append(1) or real_launch(*args)

    class Cap(float):
        def __float__(self) -> float:
            b._plan_token = workspace_owner.take(key, None)  # as b.plan() would
            return 30.0

    q, cache = _inputs()
    with pytest.raises(RuntimeError, match="BatchDecodeWrapper.run\\(\\): workspace_buffer"):
        a.run(q, cache, cap=Cap(30.0))
    assert launched == []
