"""Whether the order of the Hopper prefill's work items moves the document row: doc_causal over
``doc_probe``'s 8 packed documents, planned once with the tile map (ranges trimmed by the
map, items heaviest first by their non-EMPTY blocks), then the same items re-ordered in the
workspace and timed again. The tiles and their classes stay the same in every row; only the
order in which CTAs take items (the dynamic fetch, sm90/item_order.cuh) changes.

Orders: ``planned`` (as the plan wrote them), ``closed_form`` (heaviest first by the causal
range a plan without the map would cost: the query tile's end, ties in planned order; the
order of a plan that does not wait for the map), ``reversed`` (lightest first), ``shuffled``
(seeded), ``by_head`` (KV head, then planned order). Each order's output must equal the
planned order's bit for bit (no item is split here). TFLOP/s over visible pairs, the middle of
three ``do_bench`` medians, each after a second of idle GPU.

    python -m benchmarks.doc_order_probe
"""

from __future__ import annotations

import numpy as np

PI_SIZE = 8  # prefill_args.h ATTNC_PI_SIZE
PI_Q_TILE, PI_KV_HEAD = 1, 2
PI_COUNTERS = slice(6, 8)  # ATTNC_PI_NEXT, ATTNC_PI_CTAS_DONE: item 0's, the kernel's own


def order_keys(items: np.ndarray, order: str, seed: int = 0) -> np.ndarray:
    """The permutation of ``items`` (``[n, 8]`` int32, planned order) for ``order``."""
    n = items.shape[0]
    planned = np.arange(n)
    if order == "planned":
        return planned
    if order == "closed_form":
        return np.lexsort((planned, -items[:, PI_Q_TILE].astype(np.int64)))
    if order == "reversed":
        return planned[::-1].copy()
    if order == "shuffled":
        return np.random.default_rng(seed).permutation(n)
    if order == "by_head":
        return np.lexsort((planned, items[:, PI_KV_HEAD]))
    raise ValueError(f"order: unknown {order!r}")


def reorder(items: np.ndarray, order: str, seed: int = 0) -> np.ndarray:
    """``items`` permuted for ``order``, item 0's counter words 0 (as the planner leaves
    them; the kernel counts taken items there)."""
    out = items[order_keys(items, order, seed)].copy()
    out[:, PI_COUNTERS] = 0
    return out


# "planned" first and last: the two rows bracket the others, so drift in the card's clocks
# over the run shows as a difference between them.
ORDERS = ("planned", "closed_form", "reversed", "shuffled", "by_head", "planned")


def main() -> None:
    import argparse

    import torch

    from benchmarks.lang_v2_bench import _causal_pairs, _doc_lengths, _prefill, _tflops
    from benchmarks.timing import bench_ms

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.parse_args()
    lens = _doc_lengths(8192, 8)
    doc = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)]).cuda()
    w, run, _ = _prefill("doc_causal", [8192], "auto", {"doc": doc}, {"doc": doc})
    plan = w._require_plan()
    region = plan.region("items")
    if region is None:
        raise SystemExit("doc_order_probe: the plan has no item list")
    items = region.reshape(-1, PI_SIZE)
    planned = items.copy()
    print("doc lengths", lens, "items", planned.shape[0], "backend", w.planned_backend)
    reference = run().clone()
    for order in ORDERS:
        w._wait_for_copy()
        items[:] = reorder(planned, order)
        w._copy_to_workspace(plan)
        if not torch.equal(run(), reference):  # each item's rows are its own: same bits
            raise SystemExit(f"doc_order_probe: order {order!r} changed the output")
        ms = sorted(bench_ms([run], pause_s=1.0)[0] for _ in range(3))[1]
        print(f"doc_causal 8K, {order:12s} {_tflops(_causal_pairs(lens), ms):7.1f} TFLOP/s",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
