"""BatchDecodeWrapper.run()'s cached-call fast path, on the CPU with a recording launcher."""

from __future__ import annotations

import ctypes

import pytest
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.abi import AttncDecodeArgs
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK
from attnc.runtime.wrappers import decode as D
from attnc.runtime.wrappers import decode_launch
from attnc.runtime.wrappers.decode_planning import DecodeShape

HQ, HKV, DIM, PAGE, BATCH = 4, 2, 16, 4, 3
PER_CALL = ("q", "o", "lse")


class _Recorder:
    """Stands in for a DecodeModule: records the argument struct of every launch."""

    name = "recorder"

    def __init__(self, variant):
        self.params_type = abi.params_struct(variant.ir.params)
        self.calls: list[dict] = []

    def launch(self, args_ref, stream):
        a = args_ref._obj
        fields = {name: getattr(a, name) for name, _ in AttncDecodeArgs._fields_}
        fields["params_bytes"] = ctypes.string_at(a.variant_params, a.variant_params_size)
        self.calls.append(fields)


@pytest.fixture
def cpu_decode(monkeypatch):
    real_paged_kv = D.paged_kv
    real_check = D.tensors.check_data_tensor
    monkeypatch.setattr(
        D.tensors,
        "check_data_tensor",
        lambda name, t, shape, device_type="cuda": real_check(name, t, shape, "cpu"),
    )
    monkeypatch.setattr(decode_launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(
        D, "paged_kv", lambda kv, lay, ps, h, d, dev: real_paged_kv(kv, lay, ps, h, d, "cpu")
    )

    def make(name):
        variant = attnc.load(f"stdlib:{name}")
        w = object.__new__(D.BatchDecodeWrapper)
        w.variant, w.kv_layout, w.use_cuda_graph = variant, "NHD", False
        w._device = torch.device("cpu")
        w._shape = DecodeShape(HQ, HKV, DIM, PAGE, 1, torch.bfloat16, 0.25, 4, 8)
        w._module = _Recorder(variant)
        w._args = AttncDecodeArgs()
        w._args_ref = ctypes.byref(w._args)
        w._args.variant_params_size = ctypes.sizeof(w._module.params_type)
        w._max_page, w._batch, w._q_rows = 5, BATCH, BATCH
        w._last_kv, w._calls, w._applied = None, {}, None
        w._packer = decode_launch.ParamsPacker(variant.params)
        w._all_defaults = all(d.kind != "tensor" and d.default is not None for d in variant.params)
        w._planned_mask = NO_PLANNED_MASK
        w._debug_checks, w._page_status = False, None  # no device page check here
        return w

    return make


def _inputs(pages=8):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(BATCH, HQ, DIM, generator=gen).bfloat16()
    cache = torch.randn(pages, 2, PAGE, HKV, DIM, generator=gen).bfloat16()
    return q, cache


def _static(call):
    return {k: v for k, v in call.items() if k not in PER_CALL}


def test_repeated_call_reuses_checked_fields(cpu_decode, monkeypatch):
    w = cpu_decode("softcap")
    q, cache = _inputs()
    w.run(q, cache, cap=30.0)
    checks = []
    monkeypatch.setattr(w, "_check_q", lambda q, shape: checks.append(q) or q)
    q2 = q.clone()
    o = w.run(q2, cache, cap=30.0)
    assert not checks  # served from the cache
    first, second = w._module.calls
    assert _static(first) == _static(second)
    assert second["q"] == q2.data_ptr() and second["o"] == o.data_ptr() and second["lse"] is None
    w.run(q2, cache, cap=20.0)  # another value: checked again
    assert len(checks) == 1 and w._module.calls[-1]["params_bytes"] != first["params_bytes"]


def test_cached_calls_interleave_caches_and_return_lse(cpu_decode):
    w = cpu_decode("vanilla")
    q, cache_a = _inputs()
    _, cache_b = _inputs(pages=10)
    for _ in range(2):
        w.run(q, cache_a)
        w.run(q, cache_b)
        _, lse = w.run(q, (cache_a[:, 0], cache_a[:, 1]), return_lse=True)
    calls = w._module.calls
    assert len(w._calls) == 3
    for i in range(3):
        assert _static(calls[i]) == _static(calls[i + 3])
    assert calls[0]["k"] != calls[1]["k"] and calls[5]["lse"] == lse.data_ptr()
    assert calls[3]["lse"] is None


def test_cache_does_not_skip_checks_that_depend_on_the_plan(cpu_decode):
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    w.run(q, cache)
    w._q_rows = w._batch = BATCH + 1  # a later plan with another batch
    with pytest.raises(ValueError, match="^q: expected shape"):
        w.run(q, cache)
    w._q_rows = w._batch = BATCH
    w._max_page, w._last_kv = 8, None  # a later plan that uses page 8 of an 8-page cache
    with pytest.raises(ValueError, match="kv_indices: page index 8"):
        w.run(q, cache)


def test_copied_tensor_params_are_not_cached(cpu_decode):
    w = cpu_decode("alibi")
    q, cache = _inputs()
    slopes = torch.rand(HQ * 2)[::2]  # not contiguous: resolved to a copy
    w.run(q, cache, slopes=slopes)
    assert not w._calls
    slopes = torch.rand(HQ)
    w.run(q, cache, slopes=slopes)
    w.run(q, cache, slopes=slopes)
    assert len(w._calls) == 1
    with pytest.raises(ValueError, match="slopes"):
        w.run(q, cache, slopes=torch.rand(HQ + 1))


def test_a_scalar_given_to_plan_that_the_mask_does_not_read_is_kept(cpu_decode):
    """plan(params={"cap": 3.0}) checked the soft-cap and dropped it: run() without it
    launched the default cap 50 and run(cap=20.0) was taken, without a word."""
    w = cpu_decode("softcap")
    q, cache = _inputs()
    mask = w._mask_ranges({"cap": 3.0})
    assert mask[0].program is None  # no bound reads cap: whole requests, as without it
    w._commit_mask(mask)
    with pytest.raises(
        ValueError, match="param 'cap' is 50.0 in run\\(\\), but plan\\(\\) was given 3.0"
    ):
        w.run(q, cache)
    with pytest.raises(ValueError, match="param 'cap' is 20.0 in run"):
        w.run(q, cache, cap=20.0)
    assert w._module.calls == []
    w.run(q, cache, cap=3.0)
    packed = ctypes.c_float.from_buffer_copy(w._module.calls[-1]["params_bytes"][:4]).value
    assert packed == 3.0
    w._commit_mask(w._mask_ranges({}))  # planned again without it: any value
    w.run(q, cache, cap=20.0)


def test_run_refuses_mask_params_other_than_planned(cpu_decode):
    w = cpu_decode("sliding_window")
    q, cache = _inputs()
    mask = w._mask_ranges({"window": 64})  # what plan(params={"window": 64}) does
    assert w._planned_mask.values == {}  # set only when the plan succeeds
    w._commit_mask(mask)
    assert mask[0].program is not None and w._planned_mask.values == {"window": 64}
    w.run(q, cache, window=64)
    w.run(q, cache, window=64)  # the cached call
    with pytest.raises(
        ValueError, match="param 'window' is 32 in run\\(\\), but plan\\(\\) was given 64"
    ):
        w.run(q, cache, window=32)
    mask = w._mask_ranges({})  # a plan without params
    w._commit_mask(mask)
    assert mask[0].program is None and w._planned_mask.values == {}
    w.run(q, cache, window=32)
    with pytest.raises(ValueError, match="variant 'sliding_window': unknown param 'windw'"):
        w._mask_ranges({"windw": 3})


def test_out_overlapping_q_is_refused_also_on_the_cached_path(cpu_decode):
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    with pytest.raises(ValueError, match="^out: overlaps q in memory"):
        w.run(q, cache, out=q)
    base = torch.zeros(2 * BATCH, HQ, DIM, dtype=torch.bfloat16)
    q2, out = base[:BATCH], base[BATCH:]
    q2.copy_(q)
    w.run(q2, cache, out=out)  # side by side in one buffer: fine, and now cached
    assert len(w._calls) == 1
    shifted = base[1 : BATCH + 1]  # same shape and strides as out, so the same cache key
    with pytest.raises(ValueError, match="^out: overlaps q in memory"):
        w.run(q2, cache, out=shifted)
    assert len(w._module.calls) == 1


def test_out_with_zero_strides_is_refused(cpu_decode):
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    out = torch.zeros(1, HQ, DIM, dtype=torch.bfloat16).expand(BATCH, HQ, DIM)
    with pytest.raises(ValueError, match="^out: elements overlap in memory"):
        w.run(q, cache, out=out)
    assert not w._module.calls
