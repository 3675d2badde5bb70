"""Decode throughput against the scheduler's split candidates (numpy planner, monkeypatched).

    python tests/gpu/decode_harness/split_sweep.py

Prints TB/s of K+V for b64 x 4096, decode_zipf and decode_uniform (causal, page 16) with the
default candidates (no split and each of SPLIT_FACTORS, chosen by the predicted step time)
and with a single split factor (plus "no split"); MIN_CHUNK huge means "never split".
"""

from __future__ import annotations

import os

os.environ["ATTNC_NATIVE_PLAN"] = "0"  # the numpy scheduler reads the knobs at call time

import torch  # noqa: E402

from attnc.runtime.planning import decode_schedule  # noqa: E402
from benchmarks.decode_quick import WORKLOADS, measure  # noqa: E402

DEFAULT = decode_schedule.SPLIT_FACTORS
SETTINGS = [(DEFAULT, 256), ((1,), 256), ((2,), 256), ((4,), 256), ((8,), 256), (DEFAULT, 1 << 30)]


def main() -> None:
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for factors, min_chunk in SETTINGS:
        decode_schedule.SPLIT_FACTORS, decode_schedule.MIN_CHUNK = factors, min_chunk
        row = [measure("causal", WORKLOADS[w], ws) for w in WORKLOADS]
        cells = "  ".join(f"{w} {t:5.2f}" for w, t in zip(WORKLOADS, row, strict=True))
        print(f"split factors {factors!s:10s} min_chunk {min_chunk:>10d}: {cells} TB/s", flush=True)


if __name__ == "__main__":
    main()
