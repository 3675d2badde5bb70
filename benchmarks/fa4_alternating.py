"""attnc against FA4 on causal rows, timed alternately in one process, round after round.

The suite measures FA4 in its anchor child, a separate process with its own input sets;
through run 27 it timed FA4 once per row, at whatever power state the card was in when its
turn came, and on an H200 at its power cap a single figure moves by several percent with
that state. Here both systems share one process and one input set, and each round times
them in turn (the order flips every round) after the same idle pause, two ways:

- ``do_bench``: triton's ``do_bench`` median (256 MB L2 flush before each call), the suite's
  method;
- ``stream``: 20 calls queued back to back between two CUDA events (warm L2).

Medians over the rounds, per system and method, in TFLOP/s over the causal pairs, with every
round's milliseconds and attnc's relative difference from FA4's output. attnc runs a planned
``BatchPrefillWrapper.run()`` of ``stdlib:causal``; FA4 ``flash_attn_func(causal=True)``.
FA4 must be importable in this process (FlashInfer need not be):

    PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH \
        python -m benchmarks.fa4_alternating [--rows 8192:128,8192:64,2048:128] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks.arg_lists import int_pairs
from benchmarks.flops import prefill_flops
from benchmarks.timing_probe import stream_ms
from benchmarks.workloads import Mask

HQ, HKV = 32, 8
DEFAULT_ROWS = "8192:128,8192:64,2048:128"
HEAD_DIMS = (64, 128, 256)


def parse_rows(text: str) -> list[tuple[int, int]]:
    """``LEN:HEAD_DIM,...`` as (length, head_dim) pairs; a bad entry raises ValueError naming
    it (shown escaped)."""
    rows = []
    for item, length, head_dim in int_pairs(text, "--rows", ":", "LEN:HEAD_DIM", 7):
        if length < 1 or head_dim not in HEAD_DIMS:
            raise ValueError(f"--rows: {item!r} needs a length >= 1 and a head_dim in {HEAD_DIMS}")
        rows.append((length, head_dim))
    return rows


def causal_flops(length: int, head_dim: int) -> float:
    """FLOPs of causal attention over the pairs with i >= j (the diagonal included:
    length (length + 1) / 2 pairs), counted by ``benchmarks.flops`` as the suite counts them,
    32 query heads."""
    return float(prefill_flops(Mask("causal"), length, length, HQ, head_dim))


def _systems(length: int, head_dim: int, workspace):
    """The two callables on one seeded input set, and attnc's relative difference from FA4."""
    import torch
    from flash_attn.cute.interface import flash_attn_func

    import attnc
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(heads: int) -> torch.Tensor:
        shape = (length, heads, head_dim)
        return torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)

    q, k, v = randn(HQ), randn(HKV), randn(HKV)
    wrapper = BatchPrefillWrapper(attnc.load("stdlib:causal"), workspace)
    indptr = torch.tensor([0, length], dtype=torch.int32)
    wrapper.plan(indptr, indptr, HQ, HKV, head_dim)
    out = torch.empty_like(q)
    fns = {
        "attnc": lambda: wrapper.run(q, (k, v), out=out),
        "fa4": lambda: flash_attn_func(q[None], k[None], v[None], causal=True),
    }
    theirs = fns["fa4"]()
    theirs = (theirs[0] if isinstance(theirs, tuple) else theirs)[0].float()
    ours = fns["attnc"]().float()
    return fns, ((ours - theirs).norm() / theirs.norm()).item()


def measure(length: int, head_dim: int, rounds: int, pause_s: float, workspace) -> dict:
    """One row: per system and method the median ms, its TFLOP/s and every round's ms."""
    import torch
    from triton.testing import do_bench

    fns, rel = _systems(length, head_dim, workspace)
    times: dict[str, dict[str, list[float]]] = {n: {"do_bench": [], "stream": []} for n in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            for method in ("do_bench", "stream"):
                torch.cuda.synchronize()
                time.sleep(pause_s)
                fn = fns[name]
                ms = do_bench(fn, warmup=25, rep=100) if method == "do_bench" else stream_ms(fn)
                times[name][method].append(float(ms))
    row: dict = {"row": f"causal:{length}:{head_dim}", "rel_diff_vs_fa4": round(rel, 5)}
    for name, by_method in times.items():
        for method, xs in by_method.items():
            ms = statistics.median(xs)
            row[f"{name}_{method}_ms"] = round(ms, 4)
            row[f"{name}_{method}_tflops"] = round(causal_flops(length, head_dim) / ms / 1e9, 1)
            row[f"{name}_{method}_rounds_ms"] = [round(x, 4) for x in xs]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="LEN:HEAD_DIM,... (causal)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pause", type=float, default=1.0, help="idle seconds before each timing")
    args = parser.parse_args(argv)
    try:
        rows = parse_rows(args.rows)
    except ValueError as exc:
        parser.error(str(exc))
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not 0.0 <= args.pause <= 60.0:  # also false for NaN
        parser.error(f"--pause must be between 0 and 60 seconds, got {args.pause!r}")
    import torch

    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    for length, head_dim in rows:
        print(json.dumps(measure(length, head_dim, args.rounds, args.pause, workspace)), flush=True)


if __name__ == "__main__":
    main()
