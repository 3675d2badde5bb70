"""Where batched prefill's time goes on paged KV: causal over prefill_zipf's request lengths
through ``BatchPrefillWrapper``, ragged K/V (one tensor per K and V) next to a paged cache
(page sizes 16 and 64, random page order), per backend. TFLOP/s over visible pairs, the middle
of three ``do_bench`` medians, each after a second of idle GPU (as the suite's
``--cooldown``).

    python -m benchmarks.paged_probe [--backends sm90,fa2] [--pages 16,64]
"""

from __future__ import annotations

import argparse

from benchmarks.lang_v2_bench import HKV, HQ, D, _causal_pairs, _qkv, _tflops, _workspace
from benchmarks.workloads import prefill_zipf


def _median_ms(run) -> float:
    import torch

    from benchmarks.timing import bench_ms

    run()
    torch.cuda.synchronize()
    return sorted(bench_ms([run], pause_s=1.0)[0] for _ in range(3))[1]


def ragged_row(lens: list[int], backend: str) -> float:
    """TFLOP/s of causal over ragged K/V."""
    import torch

    import attnc

    q, k, v = _qkv(sum(lens))
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    w = attnc.BatchPrefillWrapper(attnc.load("stdlib:causal"), _workspace(), backend=backend)
    w.plan(indptr, indptr, HQ, HKV, D, dtype=torch.bfloat16)
    return _tflops(_causal_pairs(lens), _median_ms(lambda: w.run(q, (k, v))))


def paged_row(lens: list[int], backend: str, page_size: int, seed: int = 0) -> float:
    """TFLOP/s of causal over a paged cache [pages, 2, page_size, heads, D] in random order."""
    import torch

    import attnc

    gen = torch.Generator().manual_seed(seed)
    counts = [(n + page_size - 1) // page_size for n in lens]
    pages = sum(counts)
    ids = torch.randperm(pages, generator=gen).to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor(
        [n - (c - 1) * page_size for n, c in zip(lens, counts, strict=True)], dtype=torch.int32
    )
    qo = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, _, _ = _qkv(sum(lens))
    cache = torch.randn(pages, 2, page_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    w = attnc.BatchPrefillWrapper(attnc.load("stdlib:causal"), _workspace(), backend=backend)
    w.plan(qo, kv_indptr, HQ, HKV, D, kv_indices=ids.cuda(), kv_last_page_len=last,
           page_size=page_size, dtype=torch.bfloat16)  # fmt: skip
    return _tflops(_causal_pairs(lens), _median_ms(lambda: w.run(q, cache)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="sm90,fa2")
    ap.add_argument("--pages", default="16,64")
    args = ap.parse_args()
    lens = prefill_zipf()
    for backend in args.backends.split(","):
        print(f"{backend:5s} ragged        {ragged_row(lens, backend):7.1f} TFLOP/s", flush=True)
        for ps in (int(p) for p in args.pages.split(",")):
            tf = paged_row(lens, backend, ps)
            print(f"{backend:5s} paged page {ps:<3d} {tf:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
