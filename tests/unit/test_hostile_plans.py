"""Hostile or unlucky plans and runs of the wrappers, on the CPU (launchers stubbed): a value
that no longer fits the current plan, or an argument the kernels would misread, is refused
with a ValueError naming it instead of reaching a launch."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch

import attnc
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401 (a fixture)
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _Recorder, cpu_run  # noqa: F401

I32 = dict(dtype=torch.int32)


def _decode_plan_of(w, total_kv: int) -> None:
    """What a decode plan() of the fixture's batch with ``total_kv`` KV tokens sets for run()."""
    w._reads_kv_tokens = True
    w._native = SimpleNamespace(total_kv=total_kv)
    w._set_token_sizes(1)


def test_decode_cached_call_rechecks_a_kv_len_param_after_a_plan_of_other_lengths(
    cpu_decode,  # noqa: F811
) -> None:
    """A cached call kept a kv_len tensor sized for the previous plan's KV tokens."""
    w = cpu_decode("doc_causal")
    q, cache = _inputs()
    _decode_plan_of(w, 12)
    doc = torch.zeros(12, **I32)
    w.run(q, cache, doc=doc)
    _decode_plan_of(w, 15)  # the next step: the same batch, three more KV tokens
    with pytest.raises(ValueError, match=r"param 'doc' .*expected shape \[15\]"):
        w.run(q, cache, doc=doc)
    w.run(q, cache, doc=torch.zeros(15, **I32))
    assert len(w._module.calls) == 2


@pytest.fixture
def single_cpu(cpu_run, monkeypatch):  # noqa: F811
    """Variant.prefill on the CPU: every planned wrapper launches into one recorder."""
    from attnc.runtime.build.backends import PrefillChoice
    from attnc.runtime.wrappers import single_prefill

    recorders: dict[str, _Recorder] = {}

    def choice(self, *args):
        rec = recorders.setdefault(self.variant.name, _Recorder(self.variant))
        return PrefillChoice("fa2", rec, 16)

    monkeypatch.setattr(BatchPrefillWrapper, "_module_choice", choice)
    monkeypatch.setattr(single_prefill, "_PLANS", weakref.WeakKeyDictionary())
    return recorders


def _single_qkv(q_len: int = 5, kv_len: int = 7):
    q = torch.randn(q_len, HQ, D).to(torch.bfloat16)
    k, v = (torch.randn(kv_len, HKV, D).to(torch.bfloat16) for _ in "kv")
    return q, k, v


def test_single_prefill_reads_a_tensor_sm_scale_on_every_call(single_cpu) -> None:
    """The plan of one request was reused by the sm_scale object: a scale tensor written
    between two calls launched with the value it held at the first."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _single_qkv()
    scale = torch.tensor(0.5)
    variant.prefill(q, k, v, sm_scale=scale)
    scale.fill_(0.25)
    variant.prefill(q, k, v, sm_scale=scale)
    assert [c["sm_scale"] for c in single_cpu["causal"].calls] == [0.5, 0.25]
