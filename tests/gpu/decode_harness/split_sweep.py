"""Decode throughput against the planner's split candidates (module knobs, monkeypatched).

    python tests/gpu/decode_harness/split_sweep.py

Prints TB/s of K+V for b64 x 4096, decode_zipf and decode_uniform (causal, page 16) with the
default candidates (no split and each of SPLIT_FACTORS, chosen by the predicted step time)
and with a single split factor (plus "no split"); MIN_CHUNK huge means "never split". The
planner reads both knobs when a wrapper configures it for a shape (each measure makes a new
wrapper).
"""

from __future__ import annotations

import torch

from attnc.runtime.planning import decode_plan
from benchmarks.decode_quick import WORKLOADS, measure

DEFAULT = decode_plan.SPLIT_FACTORS
SETTINGS = [(DEFAULT, 256), ((1,), 256), ((2,), 256), ((4,), 256), ((8,), 256), (DEFAULT, 1 << 30)]


def main() -> None:
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for factors, min_chunk in SETTINGS:
        decode_plan.SPLIT_FACTORS, decode_plan.MIN_CHUNK = factors, min_chunk
        row = [measure("causal", WORKLOADS[w], ws) for w in WORKLOADS]
        cells = "  ".join(f"{w} {t:5.2f}" for w, t in zip(WORKLOADS, row, strict=True))
        print(f"split factors {factors!s:10s} min_chunk {min_chunk:>10d}: {cells} TB/s", flush=True)


if __name__ == "__main__":
    main()
