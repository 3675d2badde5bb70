"""Timing with triton.testing: median of many runs, cold L2, CUDA graphs for decode."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

L2_FLUSH_BYTES = 256 << 20


MAX_PAUSE_S = 60.0


def pause_error(seconds: float) -> str | None:
    """Why ``seconds`` is not a usable pause before a timing (None when it is): the pauses
    of ``--cooldown`` must be finite and between 0 and MAX_PAUSE_S."""
    if not 0.0 <= seconds <= MAX_PAUSE_S:  # also false for NaN
        return f"--cooldown must be between 0 and {MAX_PAUSE_S:g} seconds, got {seconds!r}"
    return None


def rotation_count(bytes_per_set: int, max_sets: int = 4) -> int:
    """Input sets to rotate so that one pass over them is larger than a 256 MB L2 flush."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-L2_FLUSH_BYTES // bytes_per_set)))


def rotating(fns: Sequence[Callable]) -> Callable:
    """One callable that calls ``fns`` in turn, so each call touches a different input set."""
    state = [0]

    def call():
        fn = fns[state[0] % len(fns)]
        state[0] += 1
        return fn()

    return call


def bench_ms(
    fns: Sequence[Callable], *, graph: bool = False, rep: int = 100, pause_s: float = 0.0
) -> tuple[float, str]:
    """Median milliseconds of one call, rotating over ``fns``; returns (ms, note).

    ``pause_s``: seconds the GPU is left idle first (under its power cap the card runs a
    kernel timed right after a busy stretch at lower clocks; see benchmarks/README.md).

    Eager timing uses ``do_bench`` (which also clears a 256 MB buffer between runs); with
    ``graph`` the calls are captured in a CUDA graph (``do_bench_cudagraph``), falling back to
    eager timing with a note if capture fails.
    """
    import torch
    from triton import testing

    fn = rotating(fns)
    if pause_s > 0:
        torch.cuda.synchronize()
        time.sleep(pause_s)
    if graph:
        try:
            ms = testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
            return float(ms), "graph"
        except Exception as exc:  # capture is not always possible
            torch.cuda.synchronize()
            note = f"eager (graph capture failed: {type(exc).__name__})"
            return float(testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")), note
    return float(testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")), ""
