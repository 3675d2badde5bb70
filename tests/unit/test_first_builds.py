"""A wrapper's first plan() builds the planner library and the kernel module side by side."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from attnc.runtime.planning import prefill_plan_library
from attnc.runtime.wrappers import prefill
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper


def _fake_wrapper(is_cuda: bool) -> SimpleNamespace:
    workspace = SimpleNamespace(is_cuda=is_cuda, device=torch.device("cuda" if is_cuda else "cpu"))
    return SimpleNamespace(_workspace=workspace, variant=SimpleNamespace(ir="ir"), backend="auto")


def test_first_plan_builds_planner_and_module_at_once(monkeypatch):
    """Each fake build takes 0.4 s; side by side they take about 0.4 s, in turn 0.8 s."""
    calls: list[tuple[str, str]] = []

    def slow(name: str) -> None:
        calls.append((name, threading.current_thread().name))
        time.sleep(0.4)

    monkeypatch.setattr(prefill_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "failure", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "_load", lambda: slow("planner") or "lib")
    monkeypatch.setattr(prefill, "prebuild_prefill_module", lambda *a, **k: slow("module"))
    start = time.perf_counter()
    BatchPrefillWrapper._first_builds(_fake_wrapper(True), torch.bfloat16, 128, paged=False)
    elapsed = time.perf_counter() - start
    assert sorted(name for name, _ in calls) == ["module", "planner"]
    threads = dict(calls)
    assert threads["planner"] != threads["module"]
    assert elapsed < 0.7, elapsed
    assert prefill_plan_library.ONCE.lib == "lib"  # library() now returns it at once


def test_no_side_by_side_build_when_loaded_or_on_the_cpu(monkeypatch):
    built: list[str] = []
    monkeypatch.setattr(prefill, "prebuild_prefill_module", lambda *a, **k: built.append("m"))
    monkeypatch.setattr(prefill_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "failure", None)
    BatchPrefillWrapper._first_builds(_fake_wrapper(False), torch.bfloat16, 128, paged=True)
    monkeypatch.setattr(prefill_plan_library.ONCE, "lib", "loaded")
    BatchPrefillWrapper._first_builds(_fake_wrapper(True), torch.bfloat16, 128, paged=True)
    assert built == []


def test_a_planner_build_failure_is_kept_for_library(monkeypatch):
    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(prefill_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "failure", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "_load", broken)
    monkeypatch.setattr(prefill, "prebuild_prefill_module", lambda *a, **k: None)
    BatchPrefillWrapper._first_builds(_fake_wrapper(True), torch.bfloat16, 128, paged=False)
    with pytest.raises(prefill_plan_library.PlannerUnavailable, match="no compiler"):
        prefill_plan_library.library()
