"""Quick decode throughput check (H200 targets in shared ANCHORS.md): TB/s of K+V read.

bf16, head_dim 128, 32 query / 8 KV heads, page 16, random page order; each measurement
captures ITERS wrapper.run() calls in one CUDA graph and times replays with CUDA events
(median). Also prints plan() CPU time at batch 256 and the eager run() host overhead.

    python -m benchmarks.decode_quick [variant ...]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

HQ, HKV, D, PAGE = 32, 8, 128, 16
ITERS, REPS = 10, 15
VARIANTS = ["vanilla", "causal", "softcap", "alibi", "sliding_window", "sigmoid", "prefix_lm"]
WORKLOADS = {
    "b64_kv4096": [4096] * 64,
    "decode_zipf": [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(64)],
    "decode_uniform": [512 + int(15872 * ((i * 0.6180339887) % 1.0)) for i in range(64)],
}


def params_for(name: str) -> dict[str, object]:
    return {
        "softcap": {"cap": 30.0},
        "alibi": {"slopes": (2.0 ** (-8.0 * (torch.arange(HQ) + 1) / HQ)).float().cuda()},
        "sliding_window": {"window": 1 << 30},
        "sigmoid": {"bias": -1.0},
        "prefix_lm": {"prefix_len": 0},
    }.get(name, {})


def page_table(lengths: list[int], seed: int = 0):
    pages = [-(-n // PAGE) for n in lengths]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    total = int(indptr[-1])
    g = torch.Generator().manual_seed(seed)
    indices = torch.randperm(total, generator=g).to(torch.int32)
    last = torch.tensor([(n - 1) % PAGE + 1 for n in lengths], dtype=torch.int32)
    return indptr, indices, last, total


def measure(name: str, lengths: list[int], ws: torch.Tensor) -> float:
    variant = attnc.load(f"stdlib:{name}")
    indptr, indices, last, total = page_table(lengths)
    cache = torch.randn(total, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(len(lengths), HQ, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    wrapper = BatchDecodeWrapper(variant, ws, use_cuda_graph=True)
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE)
    params = params_for(name)
    wrapper.run(q, cache, out=out, **params)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(ITERS):
            wrapper.run(q, cache, out=out, **params)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / ITERS)
    seconds = statistics.median(times)
    nbytes = 2 * sum(lengths) * HKV * D * 2
    del cache
    return nbytes / seconds / 1e12


def plan_cpu_time(ws: torch.Tensor) -> tuple[float, float, float]:
    """(plan() us, plan(params=window) us of a sliding window, eager run() host us) at batch
    256, KV 4096."""
    lengths = [4096] * 256
    indptr, indices, last, total = page_table(lengths)
    wrapper = BatchDecodeWrapper(attnc.load("stdlib:vanilla"), ws)
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE)

    def per_call(fn, n=200):
        # Wall time of the calling thread's work: process_time would also count the CPU time
        # of the driver's and torch's background threads.
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6

    plan_us = per_call(lambda: wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE))
    window = BatchDecodeWrapper(attnc.load("stdlib:sliding_window"), ws)
    masked_us = per_call(
        lambda: window.plan(indptr, indices, last, HQ, HKV, D, PAGE, params={"window": 1024})
    )
    small = [64] * 8
    indptr, indices, last, total = page_table(small)
    cache = torch.randn(total, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(8, HQ, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE)
    run_us = per_call(lambda: wrapper.run(q, cache, out=out), n=2000)
    torch.cuda.synchronize()
    return plan_us, masked_us, run_us


def main(argv: list[str]) -> None:
    names = argv or VARIANTS
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for name in names:
        tbs = measure(name, WORKLOADS["b64_kv4096"], ws)
        print(f"decode b64 kv4096 page16 {name:15s} {tbs:6.2f} TB/s", flush=True)
    for wl in ("decode_zipf", "decode_uniform"):
        for name in ("vanilla", "softcap"):
            tbs = measure(name, WORKLOADS[wl], ws)
            print(f"{wl:15s} {name:15s} {tbs:6.2f} TB/s", flush=True)
    plan_us, masked_us, run_us = plan_cpu_time(ws)
    print(f"plan() batch 256 kv 4096: {plan_us:.1f} us; with a window param: {masked_us:.1f} us")
    print(f"eager run() host time per call: {run_us:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
