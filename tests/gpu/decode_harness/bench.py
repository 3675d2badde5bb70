"""Side-by-side decode timings of kernel configurations (see run.sh).

    python tests/gpu/decode_harness/bench.py CONFIG [--build-only]

CONFIG names a set of nvcc -D flags (CONFIGS below). (The kernel before the cross-item
pipeline, timed as `base` in benchmarks/RESULTS.md, is the parent of the commit "decode: one
cp.async pipeline across a CTA's work items".) Each configuration builds into its own
ATTNC_CACHE_DIR, with its flags appended to the nvcc command (and so to the cache key).
Checks each output against the variant's float reference before timing; prints one line per
(workload, variant): TB/s of K+V bytes, median of CUDA-graph replays.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS: dict[str, tuple[str, ...]] = {
    "new": (),
    "nocross": ("-DATTNC_DECODE_CROSS_ITEM=0",),
    "l2_128": ("-DATTNC_DECODE_L2_HINT=128",),
    "l2_256": ("-DATTNC_DECODE_L2_HINT=256",),
}


def setup(config: str, cache_root: Path) -> None:
    os.environ["ATTNC_CACHE_DIR"] = str(cache_root / config)
    from attnc.runtime.build import toolchain

    extra = CONFIGS[config]
    original = toolchain.nvcc_flags

    def flags(arch, include_dirs, more=()):
        return original(arch, include_dirs, (*tuple(more), *extra, f"-DATTNC_HARNESS_{config}"))

    toolchain.nvcc_flags = flags


def main() -> None:
    config = sys.argv[1]
    build_only = "--build-only" in sys.argv
    cache_root = Path(os.environ.get("DECODE_HARNESS_CACHE", "/tmp/decode_harness_cache"))
    setup(config, cache_root)

    import torch

    import attnc
    from attnc.runtime.wrappers.decode import BatchDecodeWrapper
    from benchmarks.decode_quick import HKV, HQ, PAGE, WORKLOADS, D, page_table, params_for

    if build_only:
        from attnc.runtime.build.modules import get_decode_module

        for name in ("causal", "softcap"):
            get_decode_module(attnc.load(f"stdlib:{name}").ir, torch.bfloat16, D, arch="90a")
        print(f"{config}: built", flush=True)
        return

    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    cases = [
        ("b64_kv4096", "causal"),
        ("b64_kv4096", "softcap"),
        ("decode_zipf", "causal"),
        ("decode_uniform", "causal"),
    ]
    for wl, name in cases:
        lengths = WORKLOADS[wl]
        variant = attnc.load(f"stdlib:{name}")
        indptr, indices, last, total = page_table(lengths)
        torch.manual_seed(0)
        cache = torch.randn(total, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
        q = torch.randn(len(lengths), HQ, D, dtype=torch.bfloat16, device="cuda")
        out = torch.full_like(q, float("nan"))
        wrapper = BatchDecodeWrapper(variant, ws, use_cuda_graph=True)
        wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE)
        params = params_for(name)
        wrapper.run(q, cache, out=out, **params)
        torch.cuda.synchronize()
        first = out.clone()
        # Correctness: a spread of requests (the longest included) against the reference.
        worst = 0.0
        check = sorted({0, 1, 7, 21, 40, 63, max(range(len(lengths)), key=lambda i: lengths[i])})
        for i in check:
            pages = indices[int(indptr[i]) : int(indptr[i + 1])].long().cuda()
            kv = cache[pages]  # [pages, 2, PAGE, HKV, D]
            k = kv[:, 0].reshape(-1, HKV, D)[: lengths[i]]
            v = kv[:, 1].reshape(-1, HKV, D)[: lengths[i]]
            ref = variant.reference(q[i : i + 1], k, v, **params)
            worst = max(worst, (out[i : i + 1].float() - ref.float()).abs().max().item())
        ok = worst < 2e-2 and not torch.isnan(out).any().item()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        iters, reps = 10, 15
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for _ in range(iters):
                wrapper.run(q, cache, out=out, **params)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters)
        same = torch.equal(out, first)
        nbytes = 2 * sum(lengths) * HKV * D * 2
        tbs = nbytes / statistics.median(times) / 1e12
        sched = wrapper.last_schedule
        print(
            f"{config:8s} {wl:15s} {name:8s} {tbs:6.2f} TB/s  "
            f"{statistics.median(times) * 1e6:7.1f} us  items {sched.num_items:5d} "
            f"chunk {sched.chunk_size:5d}  maxerr {worst:.2e} {'OK' if ok else 'FAIL'} "
            f"{'bitwise-stable' if same else 'RUN-TO-RUN DIFF'}",
            flush=True,
        )
        del cache, wrapper


if __name__ == "__main__":
    main()
