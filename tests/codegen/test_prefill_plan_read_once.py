"""The host prefill planner reads the caller's index tensors once: ``check`` copies them and
the plan packs the copies, so code run between the two (a param's conversion during
``BatchPrefillWrapper.plan()``, another thread) cannot change what is planned. Before the
fix the plan re-read the caller's qo_indptr, kv_indptr, page ids and last-page lengths when
it packed the lists: a qo_indptr written after its check reached the kernels unchecked."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from prefill_plan_helpers import PlanShape, make_host_plan
from test_prefill_plan_copies import stand_in_variant

from attnc.runtime import abi
from attnc.runtime.planning import prefill_plan
from attnc.runtime.planning.prefill_planner import PrefillPlanner
from attnc.runtime.wrappers import prefill
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found"),
]

PAGE = 16
SHAPE = PlanShape(8, 2, 64, 64, 132, 8 << 20)


def _paged(batch: int, seed: int = 0) -> list[torch.Tensor]:
    """qo_indptr, kv_indptr, kv_indices, kv_last_page_len of a random paged batch."""
    rng = np.random.default_rng(seed)
    kv_lens = rng.integers(1, 700, size=batch)
    q_lens = np.minimum(kv_lens, rng.integers(1, 300, size=batch))
    pages = -(-kv_lens // PAGE)
    kv_indptr = np.concatenate([[0], np.cumsum(pages)])
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)])
    ids = rng.permutation(int(kv_indptr[-1]) + 50)[: kv_indptr[-1]]
    last = (kv_lens - 1) % PAGE + 1
    return [torch.from_numpy(np.asarray(a, np.int32)) for a in (qo_indptr, kv_indptr, ids, last)]


def _scribble(tables: list[torch.Tensor]) -> None:
    """Writes the caller could make after the check: a query range past the batch's queries,
    a KV range past its pages, a negative page id, a last-page length out of range."""
    qo, kv, ids, last = tables
    qo[1:] += 1000
    kv[-1] += 7
    ids[0] = -7
    last[0] = 0


class _WritesAfterCheck:
    """Stands in for the planner library: once ``attnc_prefill_check`` has passed, makes
    ``_scribble``'s writes to the caller's tables (as another thread could)."""

    def __init__(self, lib, tables: list[torch.Tensor]) -> None:
        self._lib, self._tables = lib, tables

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if name != "attnc_prefill_check":
            return fn

        def check(*args):
            rc = fn(*args)
            if rc == abi.PLAN_OK:
                _scribble(self._tables)
            return rc

        return check


def _planned(planner: PrefillPlanner, tables: list[torch.Tensor]) -> bytes:
    assert planner.check(*tables, PAGE)
    s = SHAPE
    planner.configure(s.num_qo_heads, s.num_kv_heads, s.head_dim, s.tile_q_tokens, s.num_ctas,
                      s.workspace_bytes)  # fmt: skip
    return bytes(prefill_plan.host_plan(planner, s.head_dim).buffer)


@pytest.mark.parametrize("batch", [3, 700])
def test_tables_written_after_the_check_are_not_planned(batch: int) -> None:
    """The packed lists are those of the values checked (700 requests: more than the copy
    buffer first holds, so the check asks for a larger one and runs again)."""
    want = _planned(PrefillPlanner(), _paged(batch))
    tables = _paged(batch)
    planner = PrefillPlanner()
    planner._lib = _WritesAfterCheck(planner._lib, tables)
    got = _planned(planner, tables)
    assert int(tables[0][1]) >= 1000 and int(tables[2][0]) == -7  # the writes were made
    assert got == want
    qo, kv = planner.checked_indptrs()
    original = _paged(batch)
    assert torch.equal(qo, original[0]) and torch.equal(kv, original[1])


def test_the_copy_holds_only_the_used_page_ids() -> None:
    """Page ids past kv_indptr[-1] are neither checked nor copied: a page table of 10^6 ids
    of which a batch uses 30 grows the copy buffer by nothing."""
    qo, kv, ids, last = _paged(3)
    spare = torch.full((1_000_000,), -1, dtype=torch.int32)
    spare[: ids.shape[0]] = ids
    planner = PrefillPlanner()
    assert planner.check(qo, kv, spare, last, PAGE)
    assert planner._copy.shape[0] == 1024
    want = make_host_plan(qo, kv, ids, last, PAGE, SHAPE)
    s = SHAPE
    planner.configure(s.num_qo_heads, s.num_kv_heads, s.head_dim, s.tile_q_tokens, s.num_ctas,
                      s.workspace_bytes)  # fmt: skip
    assert bytes(prefill_plan.host_plan(planner, s.head_dim).buffer) == bytes(want.buffer)


@pytest.fixture
def window_variant(monkeypatch):
    """stdlib sliding_window with a stand-in module (``stand_in_variant``)."""
    return stand_in_variant(monkeypatch, "sliding_window")


def test_plan_plans_the_tables_it_checked(window_variant, monkeypatch) -> None:
    """``BatchPrefillWrapper.plan()`` checks the tables, then checks its params (caller code:
    a value's conversion); tables written meanwhile are not what it plans."""

    def plan(w: BatchPrefillWrapper, tables: list[torch.Tensor]) -> bytes:
        qo, kv, ids, last = tables
        w.plan(qo, kv, 8, 2, 64, kv_indices=ids, kv_last_page_len=last, page_size=PAGE,
               params={"window": 128})  # fmt: skip
        return bytes(w._plan.buffer)  # type: ignore[union-attr]

    def wrapper() -> BatchPrefillWrapper:
        ws = torch.empty(8 << 20, dtype=torch.uint8)
        return BatchPrefillWrapper(window_variant, ws, backend="fa2")

    want = plan(wrapper(), _paged(12, seed=3))
    tables = _paged(12, seed=3)
    real = prefill.split_plan_params

    def split_and_write(*args, **kw):
        _scribble(tables)  # after the tables' check, before the plan
        return real(*args, **kw)

    monkeypatch.setattr(prefill, "split_plan_params", split_and_write)
    got = plan(wrapper(), tables)
    assert int(tables[2][0]) == -7
    assert got == want


def test_plan_from_a_conversion_inside_plan_is_refused(window_variant) -> None:
    """A param's ``__int__`` that plans another batch on the same wrapper replaced the checked
    batch under the outer ``plan()``, which then packed the inner batch's 700 requests with
    the outer's params: refused, and the wrapper plans normally afterwards."""
    ws = torch.empty(8 << 20, dtype=torch.uint8)
    w = BatchPrefillWrapper(window_variant, ws, backend="fa2")

    def plan(tables: list[torch.Tensor], window: object) -> None:
        qo, kv, ids, last = tables
        w.plan(qo, kv, 8, 2, 64, kv_indices=ids, kv_last_page_len=last, page_size=PAGE,
               params={"window": window})  # fmt: skip

    class Window(int):
        def __int__(self) -> int:
            plan(_paged(700, seed=5), 128)
            return 128

        __index__ = __int__

    with pytest.raises(RuntimeError, match=r"BatchPrefillWrapper\.plan\(\) was called while"):
        plan(_paged(3, seed=3), Window(128))
    plan(_paged(3, seed=3), 128)
    assert w._plan is not None and w._plan.batch == 3


def test_nothing_is_planned_after_a_refused_check() -> None:
    """After a refused check the parameters still point at the caller's page ids, which may be
    freed by then: ``plan()`` read them (a segfault once they were unmapped)."""
    planner = PrefillPlanner()
    assert planner.check(*_paged(3), PAGE)
    ids = torch.arange(4_000_000, dtype=torch.int32)
    last = torch.zeros(1, dtype=torch.int32)  # outside [1, page_size]
    table = [torch.tensor(a, dtype=torch.int32) for a in ([0, 4], [0, 4_000_000])]
    assert not planner.check(*table, ids, last, PAGE)
    del ids
    s = SHAPE
    planner.configure(s.num_qo_heads, s.num_kv_heads, s.head_dim, s.tile_q_tokens, s.num_ctas,
                      s.workspace_bytes)  # fmt: skip
    for refused in (
        lambda: prefill_plan.host_plan(planner, s.head_dim),
        planner.checked_indptrs,
        lambda: planner.map_starts(64),
    ):
        with pytest.raises(RuntimeError, match=r"needs tables that check\(\) passed"):
            refused()


def test_the_copies_are_host_memory_under_a_meta_default_device() -> None:
    """The copy buffer (made at first and grown for 700 requests) is a CPU tensor whatever
    torch's default device: a meta buffer has no memory (its address was 0)."""
    tables = _paged(700)
    with torch.device("meta"):
        planner = PrefillPlanner()
        assert planner.check(*tables, PAGE)
        qo, kv = planner.checked_indptrs()
    assert qo.is_cpu and torch.equal(qo, tables[0]) and torch.equal(kv, tables[1])


def test_a_mapping_of_params_is_read_once(monkeypatch) -> None:
    """A ``params`` mapping whose ``items()`` and ``[]`` disagree: the checks read the items,
    and a second plan of the same keys read ``[]`` unchecked, handing the tile map builder a
    3-entry float64 tensor where 600 int32 entries were checked."""
    variant = stand_in_variant(monkeypatch, "doc_causal")
    good = torch.zeros(600, dtype=torch.int32)

    class TwoFaced(Mapping):
        def __getitem__(self, key: str) -> torch.Tensor:
            return torch.zeros(3, dtype=torch.float64)

        def __iter__(self):
            return iter(["doc"])

        def __len__(self) -> int:
            return 1

        def items(self):  # type: ignore[override]
            return [("doc", good)]

    seen = []

    def builder(values, *rest):
        seen.append((tuple(values["doc"].shape), values["doc"].dtype))
        return np.full(1 << 16, 3, np.uint8)

    w = BatchPrefillWrapper(variant, torch.empty(8 << 20, dtype=torch.uint8), backend="fa2")
    w._map_builder = builder
    qo = torch.tensor([0, 300, 600], dtype=torch.int32)
    for _ in range(2):
        w.plan(qo, qo.clone(), 8, 2, 64, params=TwoFaced())
    assert seen == [((600,), torch.int32)] * 2


def test_a_refused_table_leaves_no_large_copy_buffer() -> None:
    """A check of 3M requests refused at its last entry grew the copy buffer to 24 MB, kept
    for the planner's life; a refused check now leaves it at its first size."""
    planner = PrefillPlanner()
    indptr = torch.arange(3_000_001, dtype=torch.int32)
    indptr[-1] = 0  # decreasing at the end: refused after the copy
    assert not planner.check(indptr, indptr.clone(), None, None, 1)
    assert "qo_indptr" in str(planner.failure())
    assert planner._copy.shape[0] == 1024
    assert planner.check(*_paged(3), PAGE)
