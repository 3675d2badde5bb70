"""``BatchPrefillWrapper.plan()`` of language-v2 variants on a CPU workspace (a stand-in
module with a 64-token tile; the tile map comes from a host builder, as the device classifier
is checked against brute force in tests/codegen/test_tile_map.py): the map lands at its fixed
place, the work list skips EMPTY tiles, run()'s values must be the planned tensors, shapes
are checked against the batch."""

from __future__ import annotations

import shutil as _shutil
import time

import numpy as np
import pytest
import torch
from prefill_plan_helpers import PlanShape, kv_token_starts, make_host_plan
from tile_map_oracle import doc_causal_map, map_starts, summarize

import attnc
from attnc.runtime import abi
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning import tile_map
from attnc.runtime.wrappers import prefill, prefill_launch
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(_shutil.which("nvcc") is None, reason="nvcc not found (host planner)"),
]

DOC_CAUSAL = """variant doc_causal {
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}"""


def brute_force_builder(values, q_lens, kv_lens, tile, block):
    """The doc_causal map from the doc ids (numpy, every pair)."""
    return doc_causal_map(values["doc"].numpy(), q_lens, kv_lens, tile, block)


def documents(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])


@pytest.fixture
def variant(monkeypatch):
    v = attnc.load(source=DOC_CAUSAL)
    module = type(
        "StandIn", (), {"module_id": "m", "ir": v.ir, "params_type": abi.params_struct(v.params)}
    )()
    monkeypatch.setattr(
        prefill, "choose_prefill_module", lambda *a, **k: PrefillChoice("fa2", module, 64)
    )
    return v


def _wrapper(variant, nbytes=4 << 20):
    w = BatchPrefillWrapper(variant, torch.empty(nbytes, dtype=torch.uint8), backend="fa2")
    w._map_builder = brute_force_builder
    return w


def test_plan_builds_the_map_at_its_fixed_place(variant):
    w = _wrapper(variant)
    lens = [300, 700]
    qo = torch.tensor([0, 300, 1000], dtype=torch.int32)
    doc = torch.cat([documents([100, 200]), documents([50, 400, 250])])
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc})
    meta = dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))
    reserve = w._map_reserve
    assert reserve > 0 and meta["off_tile_map"] == (4 << 20) - reserve
    tile = meta["tile_q_tokens"]
    want = brute_force_builder({"doc": doc}, lens, lens, tile, 64)
    ws = w._workspace
    got = ws[meta["off_tile_map"] : meta["off_tile_map"] + want.size].numpy()
    assert (got == want).all()
    start = ws[meta["off_kv_token_start"] : meta["off_kv_token_start"] + 12].view(torch.int32)
    assert start.tolist() == [0, 300, 1000]
    # Every item's KV range covers only non-empty blocks of its tile's map row.
    summary, oracle = w.tile_map, summarize(want, lens, lens, tile)
    assert summary is not None and summary.kv_block == oracle.kv_block == 64
    for field in ("row_start", "first", "end", "cumulative"):
        assert np.array_equal(getattr(summary, field), getattr(oracle, field)), field
    for item in w._plan.schedule.items:
        b, j, begin, end = int(item[0]), int(item[1]), int(item[3]), int(item[4])
        row_at = {0: 0, 1: -(-300 // tile) * -(-300 // 64)}[b] + j * -(-lens[b] // 64)
        row = want[row_at : row_at + -(-lens[b] // 64)]
        hit = np.flatnonzero(row)
        assert (begin, end) == (
            (hit[0] * 64, min((hit[-1] + 1) * 64, lens[b])) if hit.size else (0, 0)
        )
    # run() must be given the planned tensor, unchanged.
    w._check_planned_values({"doc": doc})
    with pytest.raises(ValueError, match="param 'doc': run\\(\\) was given another tensor"):
        w._check_planned_values({"doc": doc.clone()})


def test_plan_without_the_tensor_has_no_map(variant):
    w = _wrapper(variant)
    qo = torch.tensor([0, 300], dtype=torch.int32)
    w.plan(qo, qo.clone(), 4, 2, 64)
    meta = dict(zip(prefill_launch.META_FIELDS, w._meta, strict=True))
    assert meta["off_tile_map"] == -1 and meta["off_tile_map_start"] == -1 and w.tile_map is None


def test_plan_checks_the_tensor_shape(variant):
    w = _wrapper(variant)
    qo = torch.tensor([0, 300, 400], dtype=torch.int32)
    kv = torch.tensor([0, 300, 500], dtype=torch.int32)
    with pytest.raises(ValueError) as err:
        w.plan(qo, kv, 4, 2, 64, params={"doc": torch.zeros(400, dtype=torch.int32)})
    assert str(err.value) == (
        "variant 'doc_causal': param 'doc' (tensor<i32>[kv_len]): expected shape [500] "
        "(kv_len = sum of kv_len over the batch), got [400]"
    )


def test_map_too_big_for_the_reserve(variant):
    w = BatchPrefillWrapper(
        variant, torch.empty(1 << 20, dtype=torch.uint8), backend="fa2", max_tile_map_bytes=256
    )
    w._map_builder = brute_force_builder
    qo = torch.tensor([0, 4096], dtype=torch.int32)
    with pytest.raises(ValueError, match="workspace_buffer: the tile map needs .* keeps 256"):
        w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": documents([4096])})


def test_host_side_plan_time_8k_documents(variant):
    """The anchors' document workload (8K tokens, 8 documents): plan() on the host around a
    precomputed map (the device builds it on the GPU). Printed, bounded loosely."""
    cuts = sorted(torch.randperm(8191, generator=torch.Generator().manual_seed(0))[:7] + 1)
    bounds = [0, *[int(c) for c in cuts], 8192]
    doc = documents([b - a for a, b in zip(bounds, bounds[1:], strict=False)])
    w = _wrapper(variant, 64 << 20)
    cached = {}

    def builder(values, q_lens, kv_lens, tile, block):
        key = (tile, block)
        if key not in cached:
            cached[key] = brute_force_builder(values, q_lens, kv_lens, tile, block)
        return cached[key]

    w._map_builder = builder
    qo = torch.tensor([0, 8192], dtype=torch.int32)
    w.plan(qo, qo.clone(), 32, 8, 128, params={"doc": doc})
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        w.plan(qo, qo.clone(), 32, 8, 128, params={"doc": doc})
        times.append(time.perf_counter() - t0)
    print(f"plan() host time, 8K documents: median {1e6 * sorted(times)[10]:.0f} us")
    assert sorted(times)[10] < 0.05


def test_map_reserve_must_fit_the_workspace(variant):
    with pytest.raises(ValueError, match=r"max_tile_map_bytes: must be in \[0, 524288\]"):
        BatchPrefillWrapper(
            variant, torch.empty(1 << 20, dtype=torch.uint8), max_tile_map_bytes=1 << 20
        )


def test_replan_after_an_in_place_change_uses_the_new_values(variant):
    """plan() keeps its last params' checks, never their values: a tensor written in place is
    planned again (new map, new stamp), another tensor of the same shape is the planned one
    from then on, and a tensor of another shape is still refused."""
    w = _wrapper(variant)
    qo = torch.tensor([0, 512], dtype=torch.int32)
    doc = documents([128, 384])
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc})
    split = w._plan.schedule.items.copy()
    doc.fill_(0)  # one document: every tile now sees its whole causal range
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc})
    w._check_planned_values({"doc": doc})
    assert not np.array_equal(w._plan.schedule.items, split)
    assert (w.tile_map.end > 0).all() and w.tile_map.first.max() == 0  # every row from block 0
    other = doc.clone()
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": other})
    w._check_planned_values({"doc": other})
    with pytest.raises(ValueError, match="param 'doc': run\\(\\) was given another tensor"):
        w._check_planned_values({"doc": doc})
    with pytest.raises(ValueError, match="param 'doc'.*expected shape \\[512\\]"):
        w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": documents([100])})


def test_host_plan_places_map_and_token_starts():
    """kv_token_start (prefix sums, paged from the page counts) and the map's fixed place."""
    shape = PlanShape(2, 1, 64, tile_q_tokens=64, num_ctas=4, workspace_bytes=1 << 20)
    qo = torch.tensor([0, 100, 164])
    kv_indptr, last = torch.tensor([0, 3, 5]), torch.tensor([4, 16])
    idx = torch.arange(5)
    q_lens, kv_lens = np.array([100, 64]), np.array([2 * 16 + 4, 16 + 16])
    m = np.full(int(map_starts(q_lens, kv_lens, 64)[-1]), 2, dtype=np.uint8)
    host = make_host_plan(qo, kv_indptr, idx, last, 16, shape, None, m, 4096)
    assert host.kv_token_start.tolist() == [0, 36, 68]
    assert host.tile_map_offset == (1 << 20) - 4096
    assert host.tile_map_start is not None and host.tile_map_start.tolist() == [0, 2, 3]
    buf = host.packed()
    off = host.layout.offsets["kv_token_start"]
    assert buf[off : off + 12].view(torch.int32).tolist() == [0, 36, 68]
    assert kv_token_starts(torch.tensor([3, 0, 5])).tolist() == [0, 3, 3, 8]
    again = make_host_plan(qo, kv_indptr, idx, last, 16, shape, None, m, 4096)
    assert again.layout.offsets["tile_map_start"] == host.layout.offsets["tile_map_start"]


def test_host_plan_with_the_map_left_to_the_device():
    """map_on_device: the closed-form work list (as without a map), with the map's layout: its
    starts written and its place fixed, for the classifier the device runs after the copy."""
    shape = PlanShape(4, 2, 64, tile_q_tokens=64, num_ctas=8, workspace_bytes=1 << 20)
    qo = torch.tensor([0, 300, 1000])
    closed = make_host_plan(qo, qo.clone(), None, None, 1, shape, None, None, 4096)
    host = make_host_plan(qo, qo.clone(), None, None, 1, shape, None, None, 4096, True)
    assert closed.tile_map_offset == -1 and closed.tile_map_start is None
    assert host.tile_map_offset == (1 << 20) - 4096
    lens = np.array([300, 700])
    assert host.tile_map_start.tolist() == map_starts(lens, lens, 64).tolist()
    assert (host.schedule.items == closed.schedule.items).all()
    with pytest.raises(
        ValueError, match="workspace_buffer: the tile map needs 25 bytes, the wrapper keeps 1"
    ):
        make_host_plan(qo[:2], qo[:2].clone(), None, None, 1, shape, None, None, 1, True)


def test_a_plan_that_does_not_wait_needs_a_cuda_workspace(variant):
    """wait_for_tile_map=False on a CPU workspace (or with a host map builder) builds the map
    first, as the default does: the same plan and map."""
    qo = torch.tensor([0, 300, 1000], dtype=torch.int32)
    doc = torch.cat([documents([100, 200]), documents([50, 400, 250])])
    plans = []
    for wait in (True, False):
        w = BatchPrefillWrapper(
            variant, torch.zeros(4 << 20, dtype=torch.uint8), backend="fa2", wait_for_tile_map=wait
        )
        w._map_builder = brute_force_builder
        w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc})
        assert w.tile_map is not None
        plans.append((w._meta, w._workspace.clone()))
    assert plans[0][0] == plans[1][0] and torch.equal(plans[0][1], plans[1][1])
    with pytest.raises(TypeError, match="wait_for_tile_map: expected True or False, got int 0"):
        BatchPrefillWrapper(variant, torch.empty(4 << 20, dtype=torch.uint8), wait_for_tile_map=0)


def test_queue_tile_map_refuses_a_reserve_without_room_for_the_items():
    """The queued map step needs the map and the cut work list in the map's reserve;
    without room it queues nothing (not even the plan's copy) and says so (plan() then copies
    the plan, builds the map and waits for it)."""
    from attnc.runtime.wrappers import prefill_tile_map

    inputs = prefill_tile_map.MapInputs(
        torch.tensor([0, 64], dtype=torch.int32), torch.tensor([0, 64], dtype=torch.int32),
        np.array([64]), np.array([64]), np.array([0, 1]), 64, (4, 2, 64), 0.125,
    )  # fmt: skip
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    args = (None, ws, inputs, {}, None, 256 + 32 * 8)
    assert prefill_tile_map.queue_tile_map(*args, (0, 0, {}, 9)) is False


class _Entry:
    """A stand-in for a ctypes function of a module: records its arguments."""

    argtypes = None
    restype = None

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def test_queue_tile_map_points_every_step_at_the_plan(monkeypatch):
    """The one queued call gets the plan's lists to upload (the page-locked buffer, to the
    workspace's start), the classifier pointed at the plan's regions and the map region, and
    the item step at the items, the map and the scratch after the map."""
    from attnc.runtime.planning.plan_params import variant_mask_reads
    from attnc.runtime.planning.workspace import aligned
    from attnc.runtime.wrappers import prefill_tile_map

    variant = attnc.load("stdlib:doc_causal")
    seen = {}

    def queue(args, order, upload, stream):
        seen.update(args=args._obj, order=order._obj, upload=upload._obj, stream=stream)
        return 0

    lib = type("Lib", (), {})()
    lib.attnc_queue_tile_map = _Entry(queue)
    lib.attnc_tile_map_abi_version = _Entry(lambda: tile_map.TILE_MAP_ABI_VERSION)
    module = type("Module", (), {})()
    module.lib, module.ir = lib, variant.ir
    module.params_type = abi.params_struct(variant.params)
    module.raise_on_error = lambda rc: None if rc == 0 else pytest.fail(f"status {rc}")
    monkeypatch.setattr(prefill_tile_map, "raw_stream", lambda device: 77)
    inputs = prefill_tile_map.MapInputs(
        torch.tensor([0, 64], dtype=torch.int32), torch.tensor([0, 64], dtype=torch.int32),
        np.array([64]), np.array([64]), np.array([0, 3]), 64, (4, 2, 64), 0.125,
    )  # fmt: skip
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    doc = torch.zeros(64, dtype=torch.int32)
    reserve = 1 << 16
    regions = {"qo_indptr": 0, "kv_indptr": 128, "kv_token_start": 256, "tile_map_start": 384,
               "items": 512}  # fmt: skip
    args = (module, ws, inputs, {"doc": doc}, variant_mask_reads(variant), reserve)
    assert prefill_tile_map.queue_tile_map(*args, (12345, 2048, regions, 9)) is True
    base = ws.data_ptr()
    offset = (1 << 20) - reserve
    a, order, upload = seen["args"], seen["order"], seen["upload"]
    assert (upload.host, upload.device, upload.bytes) == (12345, base, 2048)
    assert (a.tile_map, a.tile_map_start) == (base + offset, base + 384)
    assert (a.qo_indptr, a.kv_token_start, a.num_entries) == (base, base + 256, 3)
    assert (order.items, order.scratch) == (base + 512, base + offset + aligned(3))
    assert (order.tile_map, order.tile_map_start) == (a.tile_map, a.tile_map_start)
    assert (order.kv_token_start, order.num_items, order.batch_size) == (base + 256, 9, 1)
    assert order.kv_block == abi.TILE_MAP_KV_BLOCK and seen["stream"].value == 77
