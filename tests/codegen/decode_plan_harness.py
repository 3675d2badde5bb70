"""Test glue for the C++ decode planner: planners over host buffers, plans with the test-only
array outputs turned into the oracle's ``Schedule`` (decode_schedule_oracle.py) so the two
can be compared field by field, and a timing loop
(``python tests/codegen/decode_plan_harness.py``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import decode_schedule_oracle as oracle
import numpy as np
import pytest
from mask_ranges_oracle import decode_spans

from attnc.runtime.build import toolchain
from attnc.runtime.planning import decode_plan, decode_plan_library
from attnc.runtime.planning.decode_plan import DecodePlanner, StepPlan
from attnc.runtime.planning.workspace import ITEM_INTS, MERGE_INTS, WorkspaceLayout, make_layout

SENTINEL = 0xAB


def have_nvcc() -> bool:
    """True when nvcc (which builds the planner library) is installed."""
    try:
        return shutil.which(toolchain.find_nvcc()) is not None
    except toolchain.ToolNotFound:
        return False


def fresh_library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Body of a module fixture: the planner library built into a fresh cache directory (and
    the library state restored afterwards)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.setattr(decode_plan_library.ONCE, "lib", None)
    mp.setattr(decode_plan_library.ONCE, "failure", None)
    decode_plan_library.library()
    yield
    mp.undo()


def planner(
    max_batch: int, max_items: int, max_ctas: int, *, workspace: int = 1 << 40,
    max_pages: int = 16, extra: int = 40,
) -> tuple[DecodePlanner, np.ndarray, WorkspaceLayout]:  # fmt: skip
    """A planner over a fresh host buffer filled with ``SENTINEL``."""
    lay = make_layout(workspace, max(max_batch, 1), max(max_items, 1), max_ctas, max_pages)
    buf = np.full(lay.work_bytes(lay.max_items) + extra, SENTINEL, np.uint8)
    return DecodePlanner(buf, lay), buf, lay


def native_schedule(
    p: DecodePlanner, kv: np.ndarray, page_begin: np.ndarray
) -> tuple[StepPlan, oracle.Schedule]:
    """Plan ``kv`` (the configured shape and spans) with the test-only outputs: the summary
    and the plan's arrays as an oracle ``Schedule``."""
    kv = np.ascontiguousarray(kv, dtype=np.int64)
    page_begin = np.ascontiguousarray(page_begin, dtype=np.int64)
    params = p.params()
    batch, ctas = kv.shape[0], params.num_ctas
    cap = max((p.buffer.shape[0] - p.layout.items) // (ITEM_INTS * 4), 0)
    items = np.empty((cap, ITEM_INTS), np.int32)
    cost = np.empty(cap, np.float64)
    cta = np.empty(ctas + 1, np.int32)
    merge = np.empty((batch, MERGE_INTS), np.int32)
    num_chunks = np.empty(batch, np.int64)
    params.batch, params.kv_lens, params.req_page_begin = (
        batch,
        kv.ctypes.data,
        page_begin.ctypes.data,
    )
    params.out_items, params.out_cost, params.out_items_cap = (
        items.ctypes.data,
        cost.ctypes.data,
        cap,
    )
    params.out_cta_indptr, params.out_merge_items = cta.ctypes.data, merge.ctypes.data
    params.out_num_chunks = num_chunks.ctypes.data
    plan = p.plan_params(params)
    n = plan.num_items
    sched = oracle.Schedule(
        items=items[:n].copy(), cta_indptr=cta, merge_items=merge[: plan.num_split].copy(),
        num_chunks=num_chunks, chunk_size=plan.chunk_size, num_part_slots=plan.num_part_slots,
        merge_rows=plan.merge_rows, cost=cost[:n].copy(),
    )  # fmt: skip
    return plan, sched


def plan_only(p: DecodePlanner, kv: np.ndarray, page_begin: np.ndarray) -> StepPlan:
    """Plan ``kv`` into the buffer without the test outputs (what a step costs, less the
    checks and copies)."""
    kv = np.ascontiguousarray(kv, dtype=np.int64)
    page_begin = np.ascontiguousarray(page_begin, dtype=np.int64)
    params = p.params()
    params.batch, params.kv_lens, params.req_page_begin = (
        kv.shape[0],
        kv.ctypes.data,
        page_begin.ctypes.data,
    )
    return p.plan_params(params)


def bench(n: int = 2000) -> list[tuple[str, float]]:
    """Median wall time of one plan at batch 256 (32/8 heads, q_len 1, 264 CTAs), per
    workload, with and without a sliding window of 1024 keys; printed and returned."""
    rng = np.random.default_rng(0)
    batch, ctas, tile = 256, 264, 64
    workloads = {
        "uniform 1..32768": rng.integers(1, 32769, batch),
        "short (100)": np.full(batch, 100),
        "zipf": np.array([min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(batch)]),
        "one long": np.array([64] * (batch - 1) + [32768]),
    }
    p, _, lay = planner(batch, 1 << 16, 1056, workspace=256 << 20, max_pages=1 << 20)
    p.configure(1, 32, 8, 1, ctas, tile, lay.max_part_rows(128), 16, lay.max_items)
    page_begin = np.arange(batch, dtype=np.int64) * 7
    rows = []
    for name, lengths in workloads.items():
        kv = lengths.astype(np.int64)
        for window in (None, 1024):
            shown = (np.maximum(kv - window, 0), kv) if window else None
            p.set_visible(
                None if shown is None else decode_spans(lambda *_, s=shown: s, kv, 1, tile)
            )
            for _ in range(100):
                plan_only(p, kv, page_begin)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                plan_only(p, kv, page_begin)
                times.append(time.perf_counter() - t0)
            label = f"{name} window={window}"
            rows.append((label, float(np.median(times)) * 1e6))
            print(f"  {label:30s} {rows[-1][1]:7.1f} us")
    p.set_visible(None)
    return rows


if __name__ == "__main__":
    print(
        f"decode_plan (C++) at batch 256, median of 2000 calls; MIN_CHUNK {decode_plan.MIN_CHUNK}"
    )
    bench()
