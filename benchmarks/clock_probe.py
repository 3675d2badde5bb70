"""SM clock and board power while a prefill row, or a bf16 GEMM for comparison, runs back to
back for a few seconds: is a kernel's sustained speed set by the card's power limit? Reads
``nvidia-smi`` every 50 ms (it only reads; no clock or power setting is touched) and prints
one JSON line per row: the milliseconds per call and TFLOP/s of the loop (TFLOP/s for the
GEMM and the causal and sigmoid rows only), the median SM clock (MHz) and power (W) over
the samples taken while it ran, and the clock-event reasons seen.

    python -m benchmarks.clock_probe [--rows causal:8192:128,gemm:8192] [--seconds 3]

Rows: the ``timing_probe`` syntax (``[fa3/]variant:len:hd[:param=value]``; ``fa3/`` runs
FlashInfer's FA3 on the same inputs), or ``gemm:N`` (an N^3 bf16 matmul).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from benchmarks.timing_probe import parse_row, planned_run


def _query() -> str:
    """The fields to read; older drivers call the reasons clocks_throttle_reasons."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        probe = ["nvidia-smi", f"--query-gpu={reasons}", "--format=csv,noheader"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return f"clocks.sm,power.draw,{reasons}"
    return "clocks.sm,power.draw,clocks.sm"


def _sampler() -> subprocess.Popen:
    cmd = ["nvidia-smi", f"--query-gpu={_query()}", "--format=csv,noheader,nounits", "-lms", "50"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _loop(fn, flops: float, seconds: float) -> dict[str, object]:
    """Run ``fn`` back to back for ``seconds`` while sampling; TFLOP/s and the samples."""
    import torch

    fn()
    torch.cuda.synchronize()
    sampler = _sampler()
    time.sleep(0.3)  # the sampler's first line
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    sampler.terminate()
    lines = sampler.communicate()[0].strip().splitlines()[3:]  # drop the idle lead-in
    clocks, power, reasons = [], [], set()
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            clocks.append(float(parts[0]))
            power.append(float(parts[1]))
            reasons.add(parts[2])
    return {
        "ms_per_call": round(1e3 * elapsed / calls, 4),
        "tflops": round(flops * calls / elapsed / 1e12, 1) if flops else None,
        "sm_mhz_median": statistics.median(clocks) if clocks else None,
        "sm_mhz_min": min(clocks) if clocks else None,
        "power_w_median": statistics.median(power) if power else None,
        "event_reasons": sorted(reasons),
        "samples": len(clocks),
    }


def _gemm(n: int):
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return (lambda: a @ b), 2.0 * n**3


def _prefill(spec: str):
    """The row's run() (timing_probe's inputs, default backend) and its FLOPs per call."""
    name, n, d, _ = parse_row(spec)
    pairs = {"causal": n * (n + 1) / 2, "sigmoid": float(n * n)}.get(name, 0.0)
    return planned_run(spec, "auto"), 4.0 * d * 32 * pairs  # 32 query heads, as timing_probe


def check_row(spec: str) -> None:
    """ValueError naming ``spec`` unless it is ``gemm:N`` (N > 0) or a timing_probe row."""
    if spec.startswith("gemm:"):
        size = spec.split(":", 1)[1]
        if not size.isdigit() or int(size) <= 0:
            raise ValueError(f"row {spec!r}: gemm:N needs a positive integer N")
        return
    parse_row(spec)


def main() -> None:
    """Check the rows, run each, print JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="gemm:8192,causal:8192:128")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    rows = args.rows.split(",")
    if not args.seconds > 0:
        ap.error("--seconds must be > 0")
    for spec in rows:
        try:
            check_row(spec)
        except ValueError as exc:
            ap.error(str(exc))
    for spec in rows:
        fn, flops = _gemm(int(spec.split(":")[1])) if spec.startswith("gemm:") else _prefill(spec)
        print(json.dumps({"row": spec, **_loop(fn, flops, args.seconds)}), flush=True)


if __name__ == "__main__":
    main()
