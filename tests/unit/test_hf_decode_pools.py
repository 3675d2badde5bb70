"""The transformers backend's decode wrappers: forward passes in flight at once in two
threads never share a wrapper; one thread reuses its wrappers step after step.

``attnc.BatchDecodeWrapper`` is stood in for (it needs CUDA); the pool logic is what runs.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch

import attnc
from attnc.integrations import hf_decode
from attnc.integrations.hf_masks import BatchSegments

POOL_KEY = ("stdlib:causal", 32, 8, 128, torch.bfloat16, None, torch.device("cpu"))


class _Layout:
    max_batch = 256
    max_pages = 1 << 20


class _WrapperStandIn:
    """Counts how many wrappers the pool makes."""

    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _WrapperStandIn.made += 1
        self.layout = _Layout()


class _Choice:
    spec = "stdlib:causal"
    variant = None


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(attnc, "BatchDecodeWrapper", _WrapperStandIn, raising=False)
    monkeypatch.setattr(hf_decode, "_pools", type(hf_decode._pools)())  # empty, same kind
    _WrapperStandIn.made = 0


def _step_wrapper(batch: int = 2) -> Any:
    """The wrapper a new step (a fresh BatchSegments) of this thread takes first."""
    step = BatchSegments(batch, 1, 100, (), None)
    return hf_decode._pooled_wrapper(_Choice(), POOL_KEY, step, batch)


def test_steps_in_flight_in_two_threads_get_different_wrappers():
    both_taken = threading.Barrier(2, timeout=5)
    got: dict[str, Any] = {}

    def forward(name: str) -> None:
        got[name] = _step_wrapper()
        both_taken.wait()  # neither step is over before the other took its wrapper

    threads = [threading.Thread(target=forward, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["x"] is not got["y"]
    assert _WrapperStandIn.made == 2


def test_one_thread_reuses_its_wrapper_every_step():
    first = _step_wrapper()
    assert all(_step_wrapper() is first for _ in range(3))
    assert _WrapperStandIn.made == 1


def test_release_drops_every_threads_wrappers():
    taken, released, again = threading.Event(), threading.Event(), []

    def forward() -> None:
        before = _step_wrapper()
        taken.set()
        released.wait(5)
        again.append(_step_wrapper() is before)

    worker = threading.Thread(target=forward)
    worker.start()
    assert taken.wait(5)
    hf_decode.release_decode_wrappers()
    released.set()
    worker.join()
    assert again == [False]


def test_a_finished_threads_pool_goes_with_it():
    worker = threading.Thread(target=_step_wrapper)
    worker.start()
    worker.join()
    gc.collect()
    assert len(hf_decode._pools) == 0
