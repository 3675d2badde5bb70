"""Variant.prefill from several threads, on the CPU (launchers stubbed): each thread plans and
launches its own wrappers (one per CUDA stream), so another thread's call neither re-plans the
wrapper between a call's plan and its launch nor evicts its plans; a variant's plans and
workspaces are freed with it, and a thread's when the thread ends."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.wrappers import single_prefill
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.tile_map_oracle import doc_causal_map
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _Recorder, cpu_run  # noqa: F401

TILE = 64  # query tokens of the stand-in module's tile
Launches = list[tuple[threading.Thread, BatchPrefillWrapper]]


@pytest.fixture
def launches(cpu_run, monkeypatch) -> Launches:  # noqa: F811
    """Variant.prefill on the CPU; the wrappers that launched, in order, with their threads."""
    used: Launches = []
    run_checked = BatchPrefillWrapper._run_checked

    def recorded(self, *args, **kwargs):
        used.append((threading.current_thread(), self))
        return run_checked(self, *args, **kwargs)

    def choice(self, *args):
        return PrefillChoice("fa2", _Recorder(self.variant), 16)

    monkeypatch.setattr(BatchPrefillWrapper, "_run_checked", recorded)
    monkeypatch.setattr(BatchPrefillWrapper, "_module_choice", choice)
    return used


def _qkv(tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, HQ, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(tokens, HKV, D, generator=g).to(torch.bfloat16) for _ in "kv")
    return q, k, v


def _start(call: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """A started thread running ``call``; what it raises goes to ``errors``."""

    def body() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 (re-raised by the test's thread)
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def _in_thread(call: Callable[[], object]) -> None:
    """Run ``call`` on a new thread to its end; raise what it raised."""
    errors: list[BaseException] = []
    thread = _start(call, errors)
    thread.join(10)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_each_thread_launches_its_own_wrapper(launches: Launches) -> None:
    """One wrapper per shape was shared by every thread: a second thread's plan() could land
    between a call's plan() and its launch."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(64)
    variant.prefill(q, k, v)
    _in_thread(lambda: variant.prefill(q, k, v))
    variant.prefill(q, k, v)
    (_, first), (other_thread, other), (_, again) = launches
    assert other_thread is not threading.current_thread()
    assert again is first  # a thread's repeated shape reuses its plan
    assert other is not first
    assert other._workspace.data_ptr() != first._workspace.data_ptr()


def test_another_threads_shapes_evict_none_of_this_threads_plans(launches: Launches) -> None:
    """The plan cache (8 shapes) was shared: another thread's new shapes evicted this one's."""
    variant = attnc.load("stdlib:causal")
    variant.prefill(*_qkv(64))

    def many_shapes() -> None:
        for tokens in range(80, 80 + 16 * 10, 16):
            variant.prefill(*_qkv(tokens))

    _in_thread(many_shapes)
    variant.prefill(*_qkv(64))
    assert launches[-1][1] is launches[0][1]


def test_a_thread_plans_one_wrapper_per_stream(launches: Launches, monkeypatch) -> None:
    """A workspace written by a plan on one stream may still be read by a launch queued on
    another: calls on two streams take two wrappers."""
    stream = [1]
    monkeypatch.setattr(single_prefill, "_stream_of", lambda device: stream[0])
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(64)
    for stream[0] in (1, 2, 1):
        variant.prefill(q, k, v)
    on_first, on_second, on_first_again = (wrapper for _, wrapper in launches)
    assert on_second is not on_first
    assert on_first_again is on_first


def _documents(tokens: int, count: int) -> torch.Tensor:
    return torch.arange(count, dtype=torch.int32).repeat_interleave(tokens // count)


def test_a_launch_reads_the_tile_map_its_own_call_planned(cpu_run, monkeypatch) -> None:  # noqa: F811
    """Thread A plans doc_causal over one document and waits before its launch while another
    call plans four documents: A's launch read the other call's tile map (the shared wrapper
    was planned again in between)."""
    tokens = 256
    map_bytes = (tokens // TILE) * (tokens // 64)
    read: list[np.ndarray] = []

    class MapReader(_Recorder):
        """Records the tile map each launch reads."""

        def launch(self, args, stream):
            read.append(np.frombuffer(ctypes.string_at(args.tile_map, map_bytes), np.uint8))

        @staticmethod
        def tile_q_tokens(*args):
            return TILE

    def host_map(values, q_lens, kv_lens, tile, block):
        return doc_causal_map(values["doc"].numpy(), q_lens, kv_lens, tile, block)

    monkeypatch.setattr(
        BatchPrefillWrapper,
        "_module_choice",
        lambda self, *a: PrefillChoice("fa2", MapReader(self.variant), TILE),
    )
    monkeypatch.setattr(BatchPrefillWrapper, "_map_builder", staticmethod(host_map))
    main = threading.current_thread()
    planned, other_done = threading.Event(), threading.Event()
    run_checked = BatchPrefillWrapper._run_checked

    def paused(self, *args, **kwargs):
        if threading.current_thread() is not main:
            planned.set()
            other_done.wait(5)
        return run_checked(self, *args, **kwargs)

    monkeypatch.setattr(BatchPrefillWrapper, "_run_checked", paused)
    variant = attnc.load("stdlib:doc_causal")
    q, k, v = _qkv(tokens)
    one, four = _documents(tokens, 1), _documents(tokens, 4)
    errors: list[BaseException] = []
    thread_a = _start(lambda: variant.prefill(q, k, v, doc=one), errors)
    assert planned.wait(5)
    variant.prefill(q, k, v, doc=four)
    other_done.set()
    thread_a.join(10)
    assert not errors
    want = [doc_causal_map(d.numpy(), [tokens], [tokens], TILE) for d in (four, one)]
    assert [m.tolist() for m in read] == [m.tolist() for m in want]


def test_a_variant_that_ran_prefill_is_freed_with_its_workspaces(launches: Launches) -> None:
    """The plans were kept in a dict keyed weakly by the variant, but every planned wrapper
    holds its variant: a variant that ever ran prefill, and its workspaces, lived forever.
    Then the variant held its plans and they held it: only the cyclic collector freed them,
    and the workspaces' device memory waited for it. Reference counting frees them now."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(64)
    variant.prefill(q, k, v)
    _in_thread(partial(variant.prefill, q, k, v))
    workspaces = [weakref.ref(wrapper._workspace) for _, wrapper in launches]
    variant_ref = weakref.ref(variant)
    launches.clear()
    gc.collect()
    gc.disable()
    try:
        del variant
        assert variant_ref() is None
        assert [ref() for ref in workspaces] == [None, None]
    finally:
        gc.enable()


def test_a_finished_threads_wrappers_are_freed(launches: Launches) -> None:
    """A thread's planned wrappers (and their workspaces) go when the thread ends, while the
    variant lives on."""
    variant = attnc.load("stdlib:causal")
    _in_thread(lambda: variant.prefill(*_qkv(64)))
    ((_, wrapper),) = launches
    wrapper_ref = weakref.ref(wrapper)
    launches.clear()
    del wrapper
    gc.collect()
    assert wrapper_ref() is None
    variant.prefill(*_qkv(64))  # this thread plans its own
    assert len(launches) == 1


def test_a_new_plan_checks_its_heads_once(launches: Launches, monkeypatch) -> None:
    """Variant.prefill checks the heads before sizing a new wrapper's map; that wrapper's
    plan() takes them as checked, and a bad head count is named before any plan."""
    from attnc.runtime.checks import tensors

    calls = []
    check_heads = tensors.check_heads
    monkeypatch.setattr(tensors, "check_heads", lambda *a: calls.append(a) or check_heads(*a))
    variant = attnc.load("stdlib:causal")
    q, k, v = _qkv(64)
    variant.prefill(q, k, v)
    assert calls == [(HQ, HKV, D)] and len(launches) == 1
    with pytest.raises(ValueError, match="^num_qo_heads: 3 is not a multiple of num_kv_heads"):
        variant.prefill(q[:, :3], k, v)
    assert len(launches) == 1
