"""Where a decode step's GPU time goes: per-kernel times (decode kernel, merge kernel) from
the torch profiler, for b64 x 4096 causal and sliding window 1024 (planned with and without
the window), with ``use_cuda_graph`` on (merge kernel always launched) and off.

    python tests/gpu/decode_harness/kernel_split.py
"""

from __future__ import annotations

import collections

import torch
from torch.profiler import ProfilerActivity, profile

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from benchmarks.decode_quick import HKV, HQ, PAGE, D, page_table

STEPS = 20
CASES = [
    ("causal", {}, False),
    ("sliding_window", {"window": 1024}, False),
    ("sliding_window", {"window": 1024}, True),
]


def kernel_times(name: str, params: dict, plan_params: bool, graph_flag: bool, ws) -> dict:
    """Mean microseconds per step of each kernel the step launches."""
    lengths = [4096] * 64
    indptr, indices, last, total = page_table(lengths)
    cache = torch.randn(total, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(64, HQ, D, dtype=torch.bfloat16, device="cuda")
    wrapper = BatchDecodeWrapper(attnc.load(f"stdlib:{name}"), ws, use_cuda_graph=graph_flag)
    extra = {"params": params} if plan_params else {}
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE, **extra)
    for _ in range(3):
        wrapper.run(q, cache, **params)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            wrapper.run(q, cache, **params)
        torch.cuda.synchronize()
    sums: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            sums[event.name[:60]] += event.device_time / STEPS
    sched = wrapper.last_schedule
    sums["(chunk size)"] = float(sched.chunk_size)
    sums["(items)"] = float(sched.num_items)
    return dict(sums)


def main() -> None:
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for name, params, plan_params in CASES:
        for graph_flag in (True, False):
            times = kernel_times(name, params, plan_params, graph_flag, ws)
            label = f"{name} plan_params={plan_params} graph_flag={graph_flag}"
            cells = ", ".join(f"{k}: {v:.1f}" for k, v in sorted(times.items()))
            print(f"{label}: {cells}", flush=True)


if __name__ == "__main__":
    main()
