"""``BatchPrefillWrapper.plan()`` given index tensors that need a host copy (on the GPU, or
not contiguous): the packed page ids must be those of the copies made for the check. Before
a fix the planner read the page ids again when it packed the lists, and they came from freed
memory (on the H200, CUDA index tensors gave garbage ids, every row NaN by the page check);
the planner now packs its own copy of what it checked (test_prefill_plan_read_once.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.wrappers import prefill
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]


def _paged_batch(seed: int):
    rng = np.random.default_rng(seed)
    kv_lens = rng.integers(1, 700, size=12)
    q_lens = np.minimum(kv_lens, rng.integers(1, 300, size=12))
    page = 16
    pages = -(-kv_lens // page)
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    ids = rng.permutation(int(kv_indptr[-1]) + 50)[: kv_indptr[-1]].astype(np.int32)
    last = ((kv_lens - 1) % page + 1).astype(np.int32)
    return torch.from_numpy(qo_indptr), torch.from_numpy(kv_indptr), ids, torch.from_numpy(last)


def _plan_bytes(w: BatchPrefillWrapper, qo, kv, ids, last) -> bytes:
    w.plan(qo, kv, 8, 2, 64, kv_indices=ids, kv_last_page_len=last, page_size=16)
    return bytes(w._plan.buffer)  # type: ignore[union-attr]


def stand_in_variant(monkeypatch, name: str) -> attnc.Variant:
    """stdlib variant ``name``, whose wrappers plan for a stand-in module of 64-token tiles
    (no GPU to pick one)."""
    v = attnc.load(f"stdlib:{name}")
    module = type(
        "StandIn", (), {"module_id": "m", "ir": v.ir, "params_type": abi.params_struct(v.params)}
    )()
    monkeypatch.setattr(
        prefill, "choose_prefill_module", lambda *a, **k: PrefillChoice("fa2", module, 64)
    )
    return v


@pytest.fixture
def variant(monkeypatch):
    """stdlib causal with a stand-in module (``stand_in_variant``)."""
    return stand_in_variant(monkeypatch, "causal")


@pytest.mark.parametrize("seed", range(4))
def test_page_ids_copied_for_the_check_stay_alive_until_the_plan(variant, seed: int) -> None:
    qo, kv, ids, last = _paged_batch(seed)
    ws = torch.empty(8 << 20, dtype=torch.uint8)
    expected = _plan_bytes(BatchPrefillWrapper(variant, ws, backend="fa2"), qo, kv,
                           torch.from_numpy(ids), last)  # fmt: skip
    # Every other element of a larger tensor: not contiguous, so plan() copies it.
    strided = torch.zeros(2 * ids.shape[0], dtype=torch.int32)
    strided[::2] = torch.from_numpy(ids)
    w = BatchPrefillWrapper(variant, torch.empty(8 << 20, dtype=torch.uint8), backend="fa2")
    got = _plan_bytes(w, qo, kv, strided[::2], last)
    for _ in range(3):  # reuse of freed blocks would change the packed ids
        torch.full((ids.shape[0],), -7, dtype=torch.int32)
        got_again = _plan_bytes(w, qo, kv, strided[::2], last)
        assert got_again == expected
    assert got == expected
