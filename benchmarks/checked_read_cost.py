"""What a bounds-checked tensor read costs in the prefill kernels, against a proven one.

The checker proves ``t[min(kv_idx, 8191)]`` inside a ``[8192]`` tensor, so that read is plain;
it cannot prove ``t[kv_idx]`` (``kv_len`` may exceed 8192), so that read is checked (a compare
per index, 0 outside the shape). At 8192 tokens both read the same elements, and the two
variants differ only in the check against the ``min``. A causal variant with no read is timed
beside them as the floor, and ``log_bias``, whose bias ``-log(1 + |t[kv_idx]|)`` costs a
logarithm (a kernel that computes what depends on the key alone once per key pays it per key,
else per element).

Each row times a planned ``BatchPrefillWrapper.run()`` (plan once, one request of random bf16
inputs, 32/8 heads) by ``timing_probe``'s methods: the device time of the kernels of one call
(median of 20 calls per kernel, summed) and 20 calls queued back to back, rounds in alternating
order with a pause before each timing. Prints one JSON line per variant and backend, then the
ratios. Usage: ``python -m benchmarks.checked_read_cost [--len 8192] [--head-dim 128]
[--backend sm90,fa2] [--rounds 2]`` (needs a CUDA GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SOURCE = """
variant no_read {
    mask = kv_idx <= q_pos;
}
variant proven {
    param t: tensor<f32>[8192];
    score = score + t[min(kv_idx, 8191)];
    mask = kv_idx <= q_pos;
}
variant checked {
    param t: tensor<f32>[8192];
    score = score + t[kv_idx];
    mask = kv_idx <= q_pos;
}
variant log_bias {
    param t: tensor<f32>[8192];
    score = score - log(1.0 + abs(t[min(kv_idx, 8191)]));
    mask = kv_idx <= q_pos;
}
"""
VARIANTS = ("no_read", "proven", "checked", "log_bias")


def planned_run(name: str, n: int, d: int, backend: str):
    """``run()`` of variant ``name`` of ``SOURCE`` on one planned request of ``n`` tokens."""
    import torch

    import attnc

    hq, hkv = 32, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    t = torch.randn(8192, device="cuda", dtype=torch.float32, generator=gen)
    variant = attnc.load(source=SOURCE, variant=name)
    wrapper = attnc.BatchPrefillWrapper(
        variant, torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend=backend
    )
    indptr = torch.tensor([0, n], dtype=torch.int32)
    wrapper.plan(indptr, indptr, hq, hkv, d, dtype=torch.bfloat16)
    params = {} if name == "no_read" else {"t": t}
    return lambda: wrapper.run(q, (k, v), **params)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.timing_probe import _kernel_ms, stream_ms

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--len", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backend", default="sm90,fa2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cooldown", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.len < 1 or args.rounds < 1:
        ap.error("--len and --rounds must be positive")
    backends = args.backend.split(",")
    runs = {(b, v): planned_run(v, args.len, args.head_dim, b) for b in backends for v in VARIANTS}
    kernels: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    streams: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in order:
            time.sleep(args.cooldown)
            kernels[key].append(sum(_kernel_ms(runs[key]).values()))
            streams[key].append(stream_ms(runs[key]))
    for b, v in runs:
        row = {
            "backend": b,
            "variant": v,
            "len": args.len,
            "head_dim": args.head_dim,
            "ms_kernels_sum": kernels[(b, v)],
            "ms_stream": streams[(b, v)],
        }
        print(json.dumps(row), flush=True)
    for b in backends:
        base = statistics.median(kernels[(b, "proven")])
        for v in VARIANTS:
            ratio = statistics.median(kernels[(b, v)]) / base
            print(f"{b} {v}: kernels {ratio:.4f}x proven", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
