"""``BatchPrefillWrapper.plan()`` on a CUDA workspace: the lists it copies equal the host
planner's (``make_host_plan`` on the CPU, itself checked byte for byte against the numpy
oracle in tests/codegen/test_prefill_plan_native.py) for the map the device built; re-plans
reuse the pinned buffers (the planner's and the map step's); a plan with a tile map
synchronises the device exactly once and a plan without one never; a re-plan waits for the
last copy before it overwrites the pinned lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prefill_plan_helpers import PlanShape, make_host_plan
from tile_map_oracle import map_starts

import attnc
from attnc.runtime.abi import TILE_MAP_KV_BLOCK as KV_BLOCK
from attnc.runtime.wrappers import prefill_launch
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D = 32, 8, 128
WORKSPACE = 128 << 20


def _workspace() -> torch.Tensor:
    return torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")


def _docs(lengths: list[int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for n in lengths:
        cuts = sorted(int(c) + 1 for c in torch.randperm(max(n - 1, 1), generator=gen)[:3])
        bounds = [0, *[c for c in cuts if c < n], n]
        parts += [torch.full((b - a,), i, dtype=torch.int32) for i, (a, b) in
                  enumerate(zip(bounds, bounds[1:], strict=False)) if b > a]  # fmt: skip
    return torch.cat(parts).cuda()


def _meta(w: BatchPrefillWrapper) -> dict[str, int]:
    return dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))


def _paged(lens: list[int], page: int, seed: int):
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *np.cumsum(pages)], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(int(indptr[-1]) + 5, generator=gen)[: int(indptr[-1])].to(torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages, strict=True)],
                        dtype=torch.int32)  # fmt: skip
    return indptr, ids, last


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("paged", [False, True])
def test_device_lists_equal_the_host_planner(seed, paged):
    rng = np.random.default_rng(seed)
    lens = [int(n) for n in rng.integers(1, 3000, int(rng.integers(1, 5)))]
    variant = attnc.load("stdlib:doc_causal")
    w = BatchPrefillWrapper(variant, _workspace(), wait_for_tile_map=True)
    qo = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    doc = _docs(lens, seed)
    kw: dict = {}
    kv = qo
    if paged:
        kv, ids, last = _paged(lens, 16, seed)
        kw = {"kv_indices": ids, "kv_last_page_len": last, "page_size": 16}
    w.plan(qo, kv, HQ, HKV, D, params={"doc": doc}, **kw)
    torch.cuda.synchronize()
    meta, host = _meta(w), w._plan
    entries = int(map_starts(np.array(lens), np.array(lens), meta["tile_q_tokens"], KV_BLOCK)[-1])
    off = meta["off_tile_map"]
    device_map = w._workspace[off : off + entries].cpu().numpy()
    shape = PlanShape(HQ, HKV, D, meta["tile_q_tokens"], w._planner._p.num_ctas, WORKSPACE)
    want = make_host_plan(
        qo, kv, kw.get("kv_indices"), kw.get("kv_last_page_len"), kw.get("page_size", 1),
        shape, w._planned_mask.program, device_map, w._map_reserve,
    )  # fmt: skip
    got = w._workspace[: want.buffer.shape[0]].cpu().numpy()
    assert np.array_equal(got, want.buffer)
    assert host.layout == want.layout and host.part_lse_offset == want.part_lse_offset


def test_replans_reuse_the_pinned_buffers():
    variant = attnc.load("stdlib:doc_causal")
    w = BatchPrefillWrapper(variant, _workspace(), wait_for_tile_map=True)
    qo = torch.tensor([0, 4096], dtype=torch.int32)
    doc = _docs([4096], 0)
    w.plan(qo, qo, HQ, HKV, D, params={"doc": doc})
    lists, staging = w._planner.out_tensor, w._map_staging.tensor
    assert lists.is_pinned() and staging.is_pinned()
    for _ in range(3):
        w.plan(qo, qo, HQ, HKV, D, params={"doc": doc})
        w.plan(qo, qo, HQ, HKV, D)
    assert w._planner.out_tensor.data_ptr() == lists.data_ptr()
    assert w._map_staging.tensor.data_ptr() == staging.data_ptr()


def _count_torch_syncs(monkeypatch) -> list[str]:
    calls: list[str] = []
    for cls, name in ((torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize")):
        inner = getattr(cls, name)

        def counted(self, _inner=inner, _what=f"{cls.__name__}.{name}"):
            calls.append(_what)
            return _inner(self)

        monkeypatch.setattr(cls, name, counted)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("device"))
    return calls


def test_map_plan_waits_in_the_module_not_in_torch(monkeypatch):
    """The map step (copies, classifier, wait) is one module call: plan() makes no torch
    synchronisation, with or without a map, and still reads the map of this plan's tensor
    on a busy stream (the staging of the plan before held another map)."""
    variant = attnc.load("stdlib:doc_causal")
    w = BatchPrefillWrapper(variant, _workspace(), wait_for_tile_map=True)
    qo = torch.tensor([0, 8192], dtype=torch.int32)
    few, many = _docs([8192], 1), _docs([1024] * 8, 2)
    w.plan(qo, qo, HQ, HKV, D, params={"doc": many})
    idle = w._plan.buffer.copy()
    w.plan(qo, qo, HQ, HKV, D, params={"doc": few})
    assert not np.array_equal(w._plan.buffer, idle)  # the two maps plan differently
    torch.cuda.synchronize()
    calls = _count_torch_syncs(monkeypatch)
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(4):
        big = big @ big  # the classifier queues behind this
    w.plan(qo, qo, HQ, HKV, D, params={"doc": many})
    assert calls == []
    np.testing.assert_array_equal(w._plan.buffer, idle)
    w.plan(qo, qo, HQ, HKV, D)
    assert calls == []


def test_replan_waits_for_the_last_copy():
    """Two plans back to back on a busy stream: the second overwrites the pinned lists only
    after the first copy left them (the workspace ends with the second plan's lists)."""
    variant = attnc.load("stdlib:causal")
    w = BatchPrefillWrapper(variant, _workspace())
    a = torch.tensor([0, 8192], dtype=torch.int32)
    b = torch.tensor([0, 100, 8192], dtype=torch.int32)
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        big = big @ big  # keep the stream busy while plan() queues its copy
        w.plan(a, a, HQ, HKV, D)
        first = w._plan.buffer.copy()
        w.plan(b, b, HQ, HKV, D)
        torch.cuda.synchronize()
        got = w._workspace[: w._plan.buffer.shape[0]].cpu().numpy()
        assert np.array_equal(got, w._plan.buffer) and not np.array_equal(first[:64], got[:64])


def test_queued_map_replan_waits_for_the_last_copy():
    """The same with the queued map step (the default, wait_for_tile_map=False), whose module
    call copies the lists: the workspace ends with the second plan's lists (the work items
    aside, which the device step cut and re-ordered)."""
    variant = attnc.load("stdlib:doc_causal")
    w = BatchPrefillWrapper(variant, _workspace())
    a = torch.tensor([0, 8192], dtype=torch.int32)
    b = torch.tensor([0, 100, 8192], dtype=torch.int32)
    doc_a, doc_b = _docs([8192], 1), _docs([100, 8092], 2)
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        big = big @ big  # keep the stream busy while plan() queues its copy
        w.plan(a, a, HQ, HKV, D, params={"doc": doc_a})
        w.plan(b, b, HQ, HKV, D, params={"doc": doc_b})
        assert w.tile_map is None  # queued: no host copy of the map
        torch.cuda.synchronize()
        plan = w._plan
        items = plan.layout.offsets["items"]
        got = w._workspace[:items].cpu().numpy()
        assert np.array_equal(got, plan.buffer[:items])
        n = int(plan.result.num_items) * 8 * 4
        got_items = w._workspace[items : items + n].view(torch.int32).view(-1, 8).cpu().numpy()
        want_items = plan.buffer[items : items + n].view(np.int32).reshape(-1, 8)
        # the same (request, query tile, KV head, part_row) items, each range within the plan's
        key = [0, 1, 2, 5]
        assert sorted(map(tuple, got_items[:, key])) == sorted(map(tuple, want_items[:, key]))
