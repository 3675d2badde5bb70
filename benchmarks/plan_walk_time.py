"""Host time of the C++ prefill planner with and without the items placed for the Hopper
kernel's alternating walk (``walk_ctas``, attnc/kernels/host/prefill_plan_walk.h): one causal
request of L tokens, 32 query / 8 KV heads, head_dim 128, the Hopper tile of 48 query tokens
over 132 CTAs. The placement runs where CTAs take two to five items and the walk alone leaves
one more than 2% above the mean (L = 2048, 2560 and 3584 here); 4096 (six items a CTA) and
8192 are left as listed. Needs no GPU (the planner is host code).

    python -m benchmarks.plan_walk_time [--lengths 2048,2560,3584,4096,8192] [--calls 200]

Prints one JSON line per length: microseconds per ``plan()`` (minimum over five batches of
``--calls`` calls), without and with the placement.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import attnc
from attnc.runtime.planning.mask_ranges import tile_range_program
from attnc.runtime.planning.prefill_planner import PrefillPlanner

HQ, HKV, D, TILE, CTAS = 32, 8, 128, 48, 132
WS_BYTES = 1 << 26


def plan_us(length: int, walk_ctas: int, calls: int) -> float:
    """Minimum over five batches of the mean microseconds of one causal plan."""
    program = tile_range_program(attnc.load("stdlib:causal").compiled.mask_analysis, {})
    indptr = torch.tensor([0, length], dtype=torch.int32)
    planner = PrefillPlanner()
    if not planner.check(indptr, indptr, None, None, 1):
        raise RuntimeError(f"the planner refused a {length}-token request")
    planner.configure(HQ, HKV, D, TILE, CTAS, WS_BYTES, walk_ctas=walk_ctas)  # as the runtime does
    for _ in range(20):
        planner.plan(program)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            planner.plan(program)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048,2560,3584,4096,8192")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    for length in (int(x) for x in args.lengths.split(",")):
        row = {
            "length": length,
            "plan_us_heaviest_first": round(plan_us(length, 0, args.calls), 1),
            "plan_us_walk": round(plan_us(length, CTAS, args.calls), 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
