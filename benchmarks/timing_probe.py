"""Times one prefill row four ways in one process, to separate the timing method from the
kernel: triton's ``do_bench`` with its L2 flush (the suite's method), back-to-back CUDA events
over 20 calls with warm L2 (the kernel harness's method), the same under a CUDA graph, and the
device time of the attention kernel alone (``torch.profiler``, a planned
``BatchPrefillWrapper`` run 20 times: no plan, no other kernel in the figure).

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


def _kernel_only_ms(run, reps: int = 20) -> float:
    """Median device time of the prefill kernel of ``run()`` (profiler events whose name
    holds ``prefill``)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    times = sorted(
        e.time_range.elapsed_us() / 1e3
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and "prefill" in e.name
    )
    return times[len(times) // 2] if times else float("nan")


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
        wrapper = attnc.BatchPrefillWrapper(
            variant, torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend=backend
        )
        indptr = torch.tensor([0, n], dtype=torch.int32)
        wrapper.plan(indptr, indptr, hq, hkv, d, dtype=torch.bfloat16)
        kernel_ms = _kernel_only_ms(lambda w=wrapper: w.run(q, (k, v)))
        print(json.dumps({
            "backend": backend, "variant": args.variant, "len": n, "head_dim": d,
            "tflops_do_bench_flush": round(flops / flush_ms / 1e9, 1),
            "tflops_events_warm": round(flops / events_ms / 1e9, 1),
            "tflops_graph_warm": round(flops / graph_ms / 1e9, 1),
            "tflops_kernel_only": round(flops / kernel_ms / 1e9, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
