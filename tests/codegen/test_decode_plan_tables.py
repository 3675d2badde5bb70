"""BatchDecodeWrapper.plan() given page tables torch cannot hand over as plain memory (zero
tensors, freed or shrunk storages) or none at all (a batch without pages), on the CPU as in
test_decode_plan_step.py: each is refused by the argument's name, or takes the fast path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_decode_plan_step import _plan, cpu, lib, make_wrapper, page_table

from attnc.runtime.wrappers import decode as D

pytestmark = pytest.mark.nvcc

__all__ = ["cpu", "lib"]  # fixtures of test_decode_plan_step used here


@pytest.mark.parametrize("which", ["indptr", "ids", "last"])
def test_a_zero_tensor_on_the_fast_path_is_refused_by_name(cpu, which):
    """torch's zero tensors have no memory: the fast path handed their null pointer to the
    planner (a segfault for the page ids or last lengths) after one checked plan."""
    w = make_wrapper()
    tables = dict(
        zip(("indptr", "ids", "last"), page_table(np.random.default_rng(5), 4), strict=True)
    )
    _plan(w, *tables.values())
    names = {"indptr": "kv_indptr", "ids": "kv_indices", "last": "kv_last_page_len"}
    tables[which] = torch._efficientzerotensor(tables[which].numel(), dtype=torch.int32)
    with pytest.raises(ValueError, match=f"^{names[which]}: expected a dense tensor, got a zero"):
        _plan(w, *tables.values())


@pytest.mark.parametrize("which", ["indptr", "ids", "last"])
def test_a_freed_page_table_is_refused_by_name(cpu, which):
    """A storage freed by resize_(0) (as sharded training frees parameters): a null pointer
    reached the planner (a segfault) on the fast path and on the checked one."""
    names = {"indptr": "kv_indptr", "ids": "kv_indices", "last": "kv_last_page_len"}
    for warm in (False, True):
        w = make_wrapper()
        tables = dict(
            zip(("indptr", "ids", "last"), page_table(np.random.default_rng(6), 4), strict=True)
        )
        if warm:
            _plan(w, *tables.values())  # the next plan may take the fast path
        table = tables[which]
        freed = table.clone()
        freed.untyped_storage().resize_(0)
        behind = torch.cat([torch.zeros(2, dtype=torch.int32), table])
        offset = behind[2:]  # a non-null address once its storage is freed
        behind.untyped_storage().resize_(0)
        shrunk = table.clone()
        shrunk.untyped_storage().resize_(4)  # a real address, fewer bytes than the view
        for bad, held in ((freed, 0), (offset, 0), (shrunk, 4)):
            tables[which] = bad
            with pytest.raises(ValueError, match=f"^{names[which]}: its storage holds {held} "):
                _plan(w, *tables.values())


def test_an_empty_page_table_takes_the_fast_path(cpu, monkeypatch):
    """Empty tensors have a null address: a guard on the address alone sent every plan of a
    batch without pages down the checked path (about 4x the time)."""
    w = make_wrapper()
    indptr, last = torch.zeros(5, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    _plan(w, indptr, torch.empty(0, dtype=torch.int32), last)
    checked = []
    real = D.BatchDecodeWrapper._plan_checked
    monkeypatch.setattr(
        D.BatchDecodeWrapper, "_plan_checked", lambda self, *a: checked.append(1) or real(self, *a)
    )
    for ids in (torch.empty(0, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)[:0]):
        _plan(w, indptr, ids, last)
    assert checked == []
