"""Where the document mask's time goes: doc_causal over 8 packed documents next to causal
8K, causal over the same lengths as separate requests (the closed-form equivalent), doc_causal
with one document (causal's tiles with the data mask), and causal 8K on uniform(-1, 1) inputs
(the kernel harness's data), and doc_causal planned with ``wait_for_tile_map=False`` (the
items cut and ordered by the map on the device). TFLOP/s over visible pairs through BatchPrefillWrapper, the
middle of three ``do_bench`` medians, each after a second of idle GPU (as the
suite's ``--cooldown``).

    python -m benchmarks.doc_probe [--backend auto|fa2|sm90] [--ncu]

``--ncu`` only launches the doc_causal row five times, untimed, for a profiler
(``scripts/ncu_sass.sh doc python3 -m benchmarks.doc_probe --ncu``).
"""

from __future__ import annotations

import benchmarks.lang_v2_bench as lb
from benchmarks.lang_v2_bench import _causal_pairs, _doc_lengths, _prefill, _tflops

BACKEND = "auto"  # the prefill backend of every row (--backend)


def row(
    label: str, name: str, lens: list[int], params: dict, pairs: float, wait: bool = True
) -> None:
    """Print one row: TFLOP/s of variant ``name`` over ragged requests ``lens`` (``wait``:
    the plan waits for the tile map)."""
    import torch

    from benchmarks.timing import bench_ms

    w, run, _ = _prefill(name, lens, BACKEND, params, params, wait)
    run()
    torch.cuda.synchronize()
    ms = sorted(bench_ms([run], pause_s=1.0)[0] for _ in range(3))[1]
    print(f"{label:34s} {w.planned_backend:5s} {_tflops(pairs, ms):7.1f} TFLOP/s", flush=True)


def _uniform_qkv(n: int, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads: int):
        x = torch.rand(n, heads, lb.D, device="cuda", generator=gen)
        return (x * 2 - 1).to(torch.bfloat16)

    return make(lb.HQ), make(lb.HKV), make(lb.HKV)


def launch_only(doc) -> None:
    """Five untimed calls of the doc_causal row (under a profiler)."""
    import torch

    _, run, _ = _prefill("doc_causal", [8192], "auto", {"doc": doc}, {"doc": doc})
    for _ in range(5):
        run()
    torch.cuda.synchronize()


def main() -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--ncu", action="store_true", help="launch the doc_causal row only, untimed")
    ap.add_argument("--backend", choices=("auto", "fa2", "sm90"), default="auto")
    args = ap.parse_args()
    global BACKEND
    BACKEND = args.backend
    lens = _doc_lengths(8192, 8)
    print("doc lengths", lens)
    doc = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)])
    doc = doc.cuda()
    if args.ncu:
        launch_only(doc)
        return
    one = torch.zeros(8192, dtype=torch.int32, device="cuda")
    row("causal 8K randn", "causal", [8192], {}, _causal_pairs([8192]))
    row("doc_causal 8K", "doc_causal", [8192], {"doc": doc}, _causal_pairs(lens))
    row("doc_causal 8K, map not waited for", "doc_causal", [8192], {"doc": doc},
        _causal_pairs(lens), wait=False)  # fmt: skip
    row("causal ragged over doc lengths", "causal", lens, {}, _causal_pairs(lens))
    row("doc_causal one doc (= causal)", "doc_causal", [8192], {"doc": one}, _causal_pairs([8192]))
    randn = lb._qkv
    lb._qkv = _uniform_qkv
    try:
        row("causal 8K uniform(-1,1)", "causal", [8192], {}, _causal_pairs([8192]))
    finally:
        lb._qkv = randn


if __name__ == "__main__":
    main()
