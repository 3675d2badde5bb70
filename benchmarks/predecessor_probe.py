"""Times a prefill row's kernels after different predecessors, to tell what a kernel's own
duration depends on (RESULTS.md run 28 item 5 found attnc's causal 8K kernel 8-14% slower
after a memset or a tiny kernel than after a GEMM or itself).

Each pattern queues ``calls`` rounds of ``predecessor(); row()`` and reads every kernel's
device time from ``torch.profiler``; a round's kernels are told apart by position (the
predecessor's and the row's kernel counts are counted alone first), so any system's kernels
can be timed, whatever their names. Patterns:

- ``none``: the row's calls back to back;
- ``gemm``: a 4096^3 bf16 matmul before each call;
- ``memset256`` / ``memset1``: a 256 MB / 1 MB ``zero_`` (the first is ``do_bench``'s flush);
- ``spin``: a ``torch.cuda._sleep`` kernel of about 1 us;
- ``idle``: the host waits for the GPU and sleeps 1 ms before each call (an idle card).

Usage: ``python -m benchmarks.predecessor_probe [--rows causal:8192:128,fa3/causal:8192:128,
gemm] [--patterns none,gemm,...] [--calls 20]`` (needs a CUDA GPU). Rows are
``benchmarks.timing_probe``'s, plus ``gemm`` (an fp16 8192^3 matmul, a witness of the clocks).
Prints one JSON line per row and pattern: the median and the quartiles of the row's device
milliseconds per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

PATTERNS = ("none", "gemm", "memset256", "memset1", "spin", "idle")


def _predecessor(name: str) -> Callable[[], None] | None:
    """The work queued before each call of a pattern (None: nothing on the GPU)."""
    import torch

    if name == "none":
        return None
    if name == "gemm":
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        return lambda: (a @ a, None)[1]
    if name in ("memset256", "memset1"):
        buf = torch.empty(
            (256 if name == "memset256" else 1) << 20, device="cuda", dtype=torch.uint8
        )
        return lambda: (buf.zero_(), None)[1]
    if name == "spin":
        return lambda: torch.cuda._sleep(2000)
    if name == "idle":

        def wait_idle() -> None:
            torch.cuda.synchronize()
            time.sleep(0.001)

        return wait_idle
    raise ValueError(f"--patterns: {name!r} is not one of {', '.join(PATTERNS)}")


def _kernel_times(work: Callable[[], None]) -> list[float]:
    """Device milliseconds of every kernel ``work()`` queues, in start order."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [e.time_range.elapsed_us() / 1e3 for e in events]


def _count(fn: Callable[[], None] | None) -> int:
    """Kernels one call of ``fn`` queues (0 for None or host-only work)."""
    if fn is None:
        return 0
    fn()
    return len(_kernel_times(fn))


def row_ms(times: list[float], k_pred: int, k_row: int, calls: int) -> list[float]:
    """The row's milliseconds in each of ``calls`` rounds of ``k_pred`` predecessor kernels
    then ``k_row`` row kernels (``times`` in start order), sorted; a ValueError when the
    count of kernels does not fit that pattern."""
    per_round = k_pred + k_row
    if k_row < 1 or len(times) != per_round * calls:
        raise ValueError(f"{len(times)} kernels, expected {calls} rounds of {k_pred} + {k_row}")
    return sorted(sum(times[i * per_round + k_pred : (i + 1) * per_round]) for i in range(calls))


def time_pattern(row: Callable[[], object], pattern: str, calls: int) -> dict:
    """The row's device milliseconds per call after the pattern's predecessor."""
    pred = _predecessor(pattern)
    k_pred, k_row = _count(pred), _count(lambda: (row(), None)[1])

    def rounds(n: int) -> None:
        for _ in range(n):
            if pred is not None:
                pred()
            row()

    rounds(5)
    try:
        ms = row_ms(_kernel_times(lambda: rounds(calls)), k_pred, k_row, calls)
    except ValueError as exc:
        return {"pattern": pattern, "error": str(exc)}
    q = statistics.quantiles(ms, n=4)
    return {"pattern": pattern, "ms_median": round(statistics.median(ms), 4),
            "ms_q1": round(q[0], 4), "ms_q3": round(q[2], 4)}  # fmt: skip


def _row_fn(spec: str, backend: str) -> Callable[[], object]:
    import torch

    from benchmarks.timing_probe import planned_run

    if spec == "gemm":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        return lambda: a @ a
    return planned_run(spec, backend)


def main() -> None:
    """Parse the arguments, time each row after each pattern, print JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="causal:8192:128,fa3/causal:8192:128,gemm")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--backend", default="sm90")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--cooldown", type=float, default=0.3, help="idle seconds before a pattern")
    args = ap.parse_args()
    patterns = args.patterns.split(",")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        ap.error(f"--patterns: {unknown[0]!r} is not one of {', '.join(PATTERNS)}")
    if args.calls < 4:
        ap.error("--calls must be at least 4 (quartiles)")
    from benchmarks.timing_probe import check_rows

    attention_rows = [r for r in args.rows.split(",") if r != "gemm"]
    if attention_rows:
        check_rows(ap, ",".join(attention_rows))
    for spec in args.rows.split(","):
        row = _row_fn(spec, args.backend)
        for pattern in patterns:
            time.sleep(args.cooldown)
            out = {"row": spec, **time_pattern(row, pattern, args.calls)}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
