"""How evenly the Hopper prefill's work items spread over the CTAs (no GPU), for the document
workload planned with and without its tile map, and for causal 8K: the busiest CTA's work
over the mean, when CTAs take items by the kernel's static walk (CTA b takes item b of each
round of gridDim items, the direction alternating per round; every variant but those whose
masks read token tensors) and when each CTA takes the next item of the list as it becomes
free (the dynamic fetch those masks use).

An item's true work is its non-EMPTY 64-key map blocks (the kernel skips EMPTY blocks by the
map whether or not the plan saw it) plus ``--item-cost`` tile equivalents for the item
switch (RESULTS.md run 29 measured 3.6-4.4). ``plan()`` runs on the CPU through
``benchmarks.plan_time``'s stand-in module with 48-token items (three consumers, 32/8 heads)
on 132 CTAs; the map is built by brute force. Without the map, the planner costs every tile
of the causal range, so its heaviest-first order is wrong for documents: this measures what
a ``plan()`` that does not wait for the map would lose.

    python -m benchmarks.plan_balance [--item-cost 4]
"""

from __future__ import annotations

import argparse
import heapq
import json
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

TOKENS, HQ, HKV, D = 8192, 32, 8, 128
TILE_Q, KV_BLOCK, CTAS = 48, 64, 132


def static_walk_loads(costs: np.ndarray, ctas: int) -> np.ndarray:
    """Each CTA's work when CTA b takes item r * ctas + b in even rounds r and
    r * ctas + ctas - 1 - b in odd ones (the alternating walk, sm90/item_order.cuh)."""
    loads = np.zeros(ctas)
    for r in range(-(-len(costs) // ctas)):
        for b in range(ctas):
            w = r * ctas + (ctas - 1 - b if r & 1 else b)
            if w < len(costs):
                loads[b] += costs[w]
    return loads


def dynamic_fetch_loads(costs: np.ndarray, ctas: int) -> np.ndarray:
    """Each CTA's work when the first CTA to finish takes the next item of the list."""
    heap = [(0.0, b) for b in range(ctas)]
    for c in costs:
        t, b = heapq.heappop(heap)
        heapq.heappush(heap, (t + float(c), b))
    loads = np.zeros(ctas)
    for t, b in heap:
        loads[b] = t
    return loads


def item_work(items: np.ndarray, classes: np.ndarray, item_cost: float) -> np.ndarray:
    """True work per item (rows of the plan's ``[n, 8]`` item list: request, query tile, KV
    head, KV begin, KV end, ...) for one request of ``classes`` ``[query tiles, blocks]``:
    its causal range clipped to the chunk, non-EMPTY blocks counted, plus ``item_cost``."""
    out = np.zeros(len(items))
    q_tiles, blocks = classes.shape
    for i, (_, q_tile, _, begin, end, *_) in enumerate(items):
        if q_tile >= q_tiles:
            continue  # a tile past the request's queries: no work
        end = min(int(end), (int(q_tile) + 1) * TILE_Q, blocks * KV_BLOCK)
        begin = max(int(begin), 0)
        seen = classes[q_tile, begin // KV_BLOCK : (end - 1) // KV_BLOCK + 1] if end > begin else []
        out[i] = float(np.count_nonzero(seen)) + item_cost
    return out


@contextmanager
def cpu_planner(doc_classes: np.ndarray) -> Iterator[object]:
    """A doc_causal ``BatchPrefillWrapper`` on a CPU workspace whose map is ``doc_classes``."""
    import torch

    import attnc
    from attnc.runtime import abi
    from attnc.runtime.wrappers import prefill, prefill_ctas
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper, PrefillChoice

    variant = attnc.load("stdlib:doc_causal")
    fields = {"module_id": "m", "ir": variant.ir, "params_type": abi.params_struct(variant.params)}
    module = type("StandIn", (), fields)()
    saved = prefill.choose_prefill_module, prefill_ctas.device_ctas
    prefill.choose_prefill_module = lambda *a, **k: PrefillChoice("sm90", module, TILE_Q)
    prefill_ctas.device_ctas = lambda *a, **k: CTAS
    try:
        w = BatchPrefillWrapper(variant, torch.empty(128 << 20, dtype=torch.uint8))
        w._map_builder = lambda values, q, kv, tile, block: doc_classes.reshape(-1)
        yield w
    finally:
        prefill.choose_prefill_module, prefill_ctas.device_ctas = saved


def rows(item_cost: float) -> list[dict]:
    """The three workloads' balance under both walks."""
    import torch

    from benchmarks.plan_time import doc_ids, doc_map

    blocks = -(-TOKENS // KV_BLOCK)
    doc = doc_ids(TOKENS)
    cases = [("documents, planned with the map", doc, {"doc": doc}),
             ("documents, planned without the map", doc, None),
             ("causal 8K", torch.zeros(TOKENS, dtype=torch.int32), None)]  # fmt: skip
    qo = torch.tensor([0, TOKENS], dtype=torch.int32)
    out = []
    for label, ids, params in cases:
        classes = doc_map(ids.numpy(), TOKENS, TOKENS, TILE_Q, KV_BLOCK).reshape(-1, blocks)
        with cpu_planner(classes) as w:
            w.plan(qo, qo, HQ, HKV, D, params=params)
            items = w._plan.region("items").reshape(-1, 8).copy()
        work = item_work(items, classes, item_cost)
        mean = work.sum() / CTAS
        out.append({
            "workload": label, "items": len(items), "blocks": int(work.sum() - item_cost * len(items)),
            "static_busiest_over_mean": round(static_walk_loads(work, CTAS).max() / mean, 4),
            "dynamic_busiest_over_mean": round(dynamic_fetch_loads(work, CTAS).max() / mean, 4),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--item-cost", type=float, default=4.0,
                        help="tile equivalents per item switch (default 4)")  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 <= args.item_cost <= 1000:
        parser.error(f"--item-cost must be in [0, 1000], got {args.item_cost}")
    for row in rows(args.item_cost):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
