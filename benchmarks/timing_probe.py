"""Times one prefill row three ways in one process, to separate the timing method from the
kernel: triton's ``do_bench`` with its L2 flush (the suite's method), back-to-back CUDA events
over 20 calls with warm L2 (the kernel harness's method), and the same under a CUDA graph.

Usage: ``python -m benchmarks.timing_probe [--variant causal] [--len 8192] [--head-dim 128]``
(needs a CUDA GPU). Prints one JSON line per backend.
"""

from __future__ import annotations

import argparse
import json


def _events_ms(fn, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    """Parse the arguments, time the row per backend, print JSON lines."""
    import torch
    from triton import testing

    import attnc

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", default="causal")
    ap.add_argument("--len", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", default="32/8")
    args = ap.parse_args()
    hq, hkv = (int(x) for x in args.heads.split("/"))
    n, d = args.len, args.head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    variant = attnc.load(f"stdlib:{args.variant}")
    flops = 4.0 * n * n * d * hq / 2  # causal: half the pairs
    for backend in ("sm90", "fa2"):

        def call(backend=backend):
            return variant.prefill(q, k, v, backend=backend)

        call()
        torch.cuda.synchronize()
        flush_ms = testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        events_ms = _events_ms(call)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            call()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                call()
        graph_ms = _events_ms(graph.replay)
        print(json.dumps({
            "backend": backend, "variant": args.variant, "len": n, "head_dim": d,
            "tflops_do_bench_flush": round(flops / flush_ms / 1e9, 1),
            "tflops_events_warm": round(flops / events_ms / 1e9, 1),
            "tflops_graph_warm": round(flops / graph_ms / 1e9, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
