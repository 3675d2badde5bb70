"""Time per call against the length of a burst: a planned prefill row queued back to back
10 to 800 times, each burst after one idle second, timed by CUDA events, with the SM clock
and board power read every 5 ms while the burst drains (NVML through torch, or
``nvidia-smi``; it only reads), then the kernel time under the profiler right after the
longest burst. Shows how soon under load the card lowers its clock (README: "Timing and the
power cap"). One JSON line per burst:

    python -m benchmarks.burst_probe [--rows causal:8192:128,causal:8192:256]

Rows: the ``timing_probe`` syntax (``variant:len:hd[:param=value]``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

from benchmarks.timing_probe import _kernel_ms, check_rows, planned_run

BURSTS = (10, 25, 50, 100, 200, 400, 800)


def read_clock_power() -> tuple[int, float]:
    """(SM MHz, board mW) now."""
    import torch

    try:
        return torch.cuda.clock_rate(), torch.cuda.power_draw()
    except Exception:  # no NVML bindings: ask nvidia-smi
        query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True).stdout
        clock, watts = out.strip().split(",")[:2]
        return int(float(clock)), float(watts) * 1000


def burst(run, calls: int) -> dict:
    """One burst of ``calls`` after an idle second: ms per call and the clocks seen."""
    import torch

    time.sleep(1.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    samples = []
    while not end.query():
        samples.append(read_clock_power())
        time.sleep(0.005)
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / calls
    clocks = [c for c, _ in samples] or [0]
    return {
        "calls": calls, "ms_per_call": round(ms, 4), "burst_ms": round(ms * calls, 1),
        "sm_mhz_min_max": [min(clocks), max(clocks)],
        "watts_max": round(max((p for _, p in samples), default=0) / 1000), "samples": len(samples),
    }  # fmt: skip


def main() -> None:
    """Parse the arguments, run every row's bursts, print JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="causal:8192:128,causal:8192:256")
    ap.add_argument("--backend", default="sm90")
    args = ap.parse_args()
    check_rows(ap, args.rows)
    import torch

    for spec in args.rows.split(","):
        run = planned_run(spec, args.backend)
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        for calls in BURSTS:
            print(json.dumps({"row": spec, **burst(run, calls)}), flush=True)
        kernel_ms = sum(_kernel_ms(run).values())
        print(json.dumps({"row": spec, "profiler_kernel_ms": round(kernel_ms, 4)}), flush=True)


if __name__ == "__main__":
    main()
