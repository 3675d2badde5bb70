"""BatchDecodeWrapper.plan() plans the values it checked, on the CPU (the step's CUDA calls
switched to host memcpys): code run after a check (the caller's ``sm_scale.__float__``, or
another thread writing the tables) cannot change what is planned. kv_indptr checked where the
plan-time tensor params are sized by it is a copy of its own; when the mask's range rows read
the KV lengths, the host page ids are staged by the check that reads them, once."""

from __future__ import annotations

import pytest
import test_decode_plan_step as S
import torch
from test_decode_plan_checked_once import I32, SCORE_BIAS, _Calls, _good, wrapper
from test_decode_plan_step import DIM, HKV, HQ, cpu, lib

from attnc.runtime.wrappers import decode as D
from attnc.runtime.wrappers import decode_launch, decode_plan_masks

pytestmark = pytest.mark.nvcc

__all__ = ["cpu", "lib"]  # fixtures of test_decode_plan_step used here


def _written(w) -> tuple[object, ...]:
    """What the last plan of ``w`` wrote: its work region, its staged page ids, its batch and
    largest page id."""
    lay, ws = w.layout, w._ws.numpy()
    n, nnz = lay.work_bytes(w.last_schedule.num_items), int(w._native.result.nnz)
    return (
        ws[:n].tobytes(),
        ws[lay.page_ids : lay.page_ids + 4 * nnz].tobytes(),
        w._batch,
        w._max_page,
    )


def _plan_good(name: str, w, tables, sm_scale=None, params=None) -> None:
    """plan() of ``_good(name)``'s scalars on ``tables`` (indptr, ids, last)."""
    kw = _good(name)
    w.plan(
        *tables, HQ, HKV, DIM, 16, q_len_per_request=kw["q_len"], sm_scale=sm_scale,
        params=kw.get("params") if params is None else params,
    )  # fmt: skip


def _tables(name: str) -> list[torch.Tensor]:
    kw = _good(name)
    return [torch.tensor(kw[k], **I32) for k in ("indptr", "ids", "last")]


@pytest.mark.parametrize("name", ["per_request_window", "lengths_window"])
def test_kv_indptr_changed_after_its_check_is_not_planned(cpu, name):
    """kv_indptr is checked where the tensor params are sized by it; caller code run after
    that (the scale's ``__float__``) changes the caller's tensor before the C++ step, which
    does not check the entries again: the plan is that of the values checked."""
    want = wrapper(name, max_batch=8, max_pages=64)
    _plan_good(name, want, _tables(name), sm_scale=0.1)
    tables = _tables(name)

    class Scale:
        def __float__(self) -> float:
            tables[0][1] = 1000
            return 0.1

    w = wrapper(name, max_batch=8, max_pages=64)
    _plan_good(name, w, tables, sm_scale=Scale())
    assert tables[0].tolist() == [0, 1000, 5, 9]
    assert _written(w) == _written(want)


def test_kv_indptr_changed_after_its_check_on_the_fast_path(cpu, monkeypatch):
    """The fast path of a plan with tensor params plans the checked kv_indptr's copy: the
    caller's table changed after the check (by another thread, say) is not planned."""
    w, want = wrapper("score_bias", SCORE_BIAS), wrapper("score_bias", SCORE_BIAS)
    params = {"bias": torch.zeros(3)}
    for planned in (want, w):
        _plan_good("score_bias", planned, _tables("score_bias"), params=params)
    tables = _tables("score_bias")
    real = decode_plan_masks.split_plan_params

    def split_and_write(*args, **kw):
        tables[0][1] = 1000  # after the check of kv_indptr, before the step
        return real(*args, **kw)

    monkeypatch.setattr(decode_plan_masks, "split_plan_params", split_and_write)
    calls = _Calls(w._native._lib)
    w._native._lib = calls
    _plan_good("score_bias", w, tables, params=params)
    assert calls.calls == [("attnc_decode_step", 1)]  # the fast path's step
    assert tables[0][1] == 1000 and _written(w) == _written(want)


class _WritesIdsAfterCheck:
    """Stands in for the planner library: once ``attnc_decode_check`` has returned, writes
    a negative page id into the caller's ``ids`` (as another thread could)."""

    def __init__(self, lib, ids: torch.Tensor) -> None:
        self._lib, self._ids = lib, ids

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if name != "attnc_decode_check":
            return fn

        def check(*args):
            rc = fn(*args)
            self._ids[2] = -7
            return rc

        return check


def test_page_ids_changed_after_the_check_are_not_staged(cpu):
    """When the range rows read the KV lengths the page table is checked before the step; the
    host page ids staged (and copied to the workspace) are those that check read, not the
    caller's as they are at the step."""
    want = wrapper("lengths_window", max_batch=8, max_pages=64)
    _plan_good("lengths_window", want, _tables("lengths_window"))
    w = wrapper("lengths_window", max_batch=8, max_pages=64)
    _plan_good("lengths_window", w, _tables("lengths_window"))  # the planner made
    tables = _tables("lengths_window")
    w._native._lib = _WritesIdsAfterCheck(w._native._lib, tables[1])
    _plan_good("lengths_window", w, tables)
    assert tables[1][2] == -7
    assert _written(w) == _written(want)


def test_plan_from_a_conversion_inside_plan_is_refused(cpu, monkeypatch):
    """A param's conversion planning another batch on the same wrapper would replace the
    checked tables under the outer ``plan()``: refused, and the wrapper plans afterwards (an
    ``sm_scale.__float__`` doing so is refused as not a float)."""
    name = "per_request_window"
    w = wrapper(name, max_batch=8, max_pages=64)

    class Scale:
        def __float__(self) -> float:
            _plan_good(name, w, _tables(name), sm_scale=0.1)
            return 0.1

    with pytest.raises(ValueError, match="^sm_scale: expected a float"):
        _plan_good(name, w, _tables(name), sm_scale=Scale())
    real = decode_plan_masks.split_plan_params

    def split_and_plan(*args, **kw):
        _plan_good(name, w, _tables(name), sm_scale=0.1)
        return real(*args, **kw)

    monkeypatch.setattr(decode_plan_masks, "split_plan_params", split_and_plan)
    with pytest.raises(RuntimeError, match=r"BatchDecodeWrapper\.plan\(\) was called while"):
        _plan_good(name, w, _tables(name), sm_scale=0.1)
    monkeypatch.setattr(decode_plan_masks, "split_plan_params", real)
    want = wrapper(name, max_batch=8, max_pages=64)
    _plan_good(name, want, _tables(name), sm_scale=0.1)
    _plan_good(name, w, _tables(name), sm_scale=0.1)
    assert _written(w) == _written(want)


def test_plan_from_a_param_conversion_inside_run_launches_nothing(cpu, monkeypatch):
    """``cap.__float__`` planning 60 requests on the same wrapper during ``run()``: the 2-row
    q checked against the first plan was launched with a workspace walking 60 requests; now
    nothing is launched. A cached call checks the same (its key made by caller code, here a
    stand-in), and the wrapper then runs its new plan."""
    real_check, real_paged = D.tensors.check_data_tensor, D.paged_kv
    monkeypatch.setattr(
        D.tensors,
        "check_data_tensor",
        lambda n, t, s, device_type="cuda": real_check(n, t, s, "cpu"),
    )
    monkeypatch.setattr(D, "paged_kv", lambda kv, *a: real_paged(kv, *a[:-1], "cpu"))
    monkeypatch.setattr(decode_launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    w = S.make_wrapper(name="softcap")
    w._device = torch.device("cpu")
    launched = []
    for module, *_ in w._modules.values():
        module.launch = lambda args, stream: launched.append(stream)

    def table(batch: int) -> tuple[torch.Tensor, ...]:
        indptr = torch.arange(batch + 1, dtype=torch.int32)
        return indptr, torch.arange(batch, dtype=torch.int32), torch.full((batch,), 3, **I32)

    class Cap(float):
        def __float__(self) -> float:
            S._plan(w, *table(60))
            return 30.0

    cache = torch.zeros(60, 2, S.PAGE, HKV, DIM, dtype=torch.bfloat16)
    q = torch.zeros(2, HQ, DIM, dtype=torch.bfloat16)
    refused = r"^attnc: BatchDecodeWrapper\.run\(\): plan\(\) of the same wrapper"
    S._plan(w, *table(2))
    with pytest.raises(RuntimeError, match=refused):
        w.run(q, cache, cap=Cap(30.0))
    S._plan(w, *table(2))
    w.run(q, cache, cap=30.0)  # remembered: the same call again is a cached one
    real_key = D.call_key

    def key_and_plan(*args, **kw):
        S._plan(w, *table(2)[:2], torch.full((2,), 9, **I32))  # a plan the cached call fits
        return real_key(*args, **kw)

    cached, real_cached = [], D.BatchDecodeWrapper._run_cached
    monkeypatch.setattr(
        D.BatchDecodeWrapper, "_run_cached", lambda *a: cached.append(1) or real_cached(*a)
    )
    monkeypatch.setattr(D, "call_key", key_and_plan)
    launched.clear()
    with pytest.raises(RuntimeError, match=refused):
        w.run(q, cache, cap=30.0)
    assert launched == [] and cached == [1]
    monkeypatch.setattr(D, "call_key", real_key)
    w.run(q, cache, cap=30.0)
    assert len(launched) == 1
