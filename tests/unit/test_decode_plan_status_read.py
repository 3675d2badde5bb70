"""When decode ``plan()`` reads the device page-id status word (CPU, a fake word): after a
launch since the last read, or always once a CUDA-graph wrapper has launched (replays are
unseen); never without a launch, so back-to-back plans with device-resident page ids do not
synchronise."""

from __future__ import annotations

import pytest
import torch

from attnc.runtime.checks.page_status import PageStatus
from attnc.runtime.wrappers.decode import BatchDecodeWrapper


def _wrapper(graph: bool) -> tuple[BatchDecodeWrapper, list[int]]:
    """A wrapper whose plan() stops after the status read; reads are counted."""
    w = object.__new__(BatchDecodeWrapper)
    w.use_cuda_graph = graph
    status = PageStatus(torch.device("cpu"))
    reads: list[int] = []
    real = status.raise_if_set
    status.raise_if_set = lambda: reads.append(1) or real()  # type: ignore[method-assign]
    status.pending = True  # the planned page ids live on the device
    w._page_status = status
    w._planned_mask = type("M", (), {"values": {}})()
    w._fast = None
    w._plan_checked = lambda *a, **k: None  # the rest of plan() is not under test
    return w, reads


def _plan(w: BatchDecodeWrapper) -> None:
    w.plan(None, None, None, 8, 8, 128, 16)  # type: ignore[arg-type]


def test_plan_reads_only_after_a_launch():
    w, reads = _wrapper(graph=False)
    _plan(w)
    _plan(w)
    assert reads == []  # no run(): nothing can have set the word
    w._launched = True  # what run() sets before each launch
    _plan(w)
    assert reads == [1]
    _plan(w)
    assert reads == [1]  # read once per launch period


def test_graph_wrapper_reads_every_plan_after_its_first_launch():
    w, reads = _wrapper(graph=True)
    _plan(w)
    assert reads == []
    w._launched = True  # a run() captured into a graph: its replays are not seen
    for _ in range(3):
        _plan(w)
    assert reads == [1, 1, 1]


def test_a_found_bad_page_is_reported_and_read_again_next_time():
    w, reads = _wrapper(graph=False)
    w._page_status.word.fill_(3 << 32 | 77)  # request 3, page id 77
    w._launched = True
    with pytest.raises(ValueError, match=r"kv_indices: request 3 uses page id 77\b"):
        _plan(w)
    _plan(w)  # the launch flag survives the raise: read again (now clear)
    assert reads == [1, 1]
    _plan(w)
    assert reads == [1, 1]


def test_run_paths_mark_the_launch():
    """Every launch site of run() sets the flag before launching (source check: the launch
    paths need a device)."""
    import inspect

    from attnc.runtime.wrappers import decode

    assert "module.launch(" not in inspect.getsource(decode.BatchDecodeWrapper.run)
    for fn in (
        decode.BatchDecodeWrapper._run_checked,
        decode.BatchDecodeWrapper._run_cached,
        decode.BatchDecodeWrapper._launch_functional,
    ):
        src = inspect.getsource(fn)
        first_launch = src.index("module.launch(")
        assert 0 <= src.index("self._launched = True") < first_launch, fn.__name__
