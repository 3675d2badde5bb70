"""Hostile or unlucky plans and runs of the wrappers, on the CPU (launchers stubbed): a value
that no longer fits the current plan, or an argument the kernels would misread, is refused
with a ValueError naming it instead of reaching a launch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401 (a fixture)

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
