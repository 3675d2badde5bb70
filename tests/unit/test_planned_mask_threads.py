"""The plan-time memos a variant keeps for every thread that plans it (``PlannedMask``'s of
plan params, the closed-form KV ranges): a thread evicting the oldest entry while another
evicts the same one raised a bare ``KeyError`` from plan()."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import attnc
from attnc.runtime.planning import mask_ranges
from attnc.runtime.planning.mask_ranges import PlannedMask


class _PausingMemo(dict):
    """A full memo whose first ``pop`` on ``paused_thread`` waits (at most 5 s) for ``resume``:
    the moment another thread may evict the same oldest entry."""

    def __init__(self, size: int) -> None:
        super().__init__({("filler", i): None for i in range(size)})
        self.paused_thread: threading.Thread | None = None
        self.at_pop, self.resume = threading.Event(), threading.Event()

    def pop(self, key, *default):
        if threading.current_thread() is self.paused_thread and not self.at_pop.is_set():
            self.at_pop.set()
            self.resume.wait(5)
        return super().pop(key, *default)


def _plan_params(variant: object, window: int) -> object:
    return PlannedMask.from_plan_params(variant, {"window": window})


def _closed_form(variant: object, window: int) -> object:
    return mask_ranges._closed_form(variant, {"window": window})


def _thread(call: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """A thread (not started) running ``call``; what it raises goes to ``errors``."""

    def body() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 (reported by the test's thread)
            errors.append(e)

    return threading.Thread(target=body)


@pytest.mark.parametrize(
    ("memo_name", "plan"),
    [("planned_masks", _plan_params), ("closed_form_ranges", _closed_form)],
)
def test_two_threads_evicting_one_memo_both_plan(
    memo_name: str, plan: Callable[[object, int], object]
) -> None:
    """Thread A stops between choosing the oldest entry and dropping it; thread B plans
    another window meanwhile (it may wait for A, up to a second); both must succeed."""
    variant = attnc.load("stdlib:sliding_window")
    memo = _PausingMemo(mask_ranges._PLANNED_MASKS)
    setattr(variant.memo, memo_name, memo)
    errors: list[BaseException] = []
    thread_a = memo.paused_thread = _thread(lambda: plan(variant, 1), errors)
    thread_a.start()
    assert memo.at_pop.wait(5)
    thread_b = _thread(lambda: plan(variant, 2), errors)
    thread_b.start()
    thread_b.join(1.0)  # B evicts now, or waits for A
    memo.resume.set()
    thread_a.join(10)
    thread_b.join(10)
    assert errors == []
    assert (("window", int, 1),) in memo and (("window", int, 2),) in memo
    assert len(memo) == mask_ranges._PLANNED_MASKS
