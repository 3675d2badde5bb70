"""Times prefill rows several ways in one process, to separate the timing method from the
kernel. Every figure times a planned ``BatchPrefillWrapper.run()`` (plan once):

- ``do_bench_flush``: triton's ``do_bench`` with its 256 MB L2 flush before each call (the
  suite's method);
- ``stream``: 20 calls queued back to back between two CUDA events (warm L2, no host gaps);
- ``kernels``: the device time of every kernel of one ``run()`` (``torch.profiler``, median
  of 20 calls per kernel name), and their sum.

Usage: ``python -m benchmarks.timing_probe [--rows causal:8192:128,...] [--backend sm90]``
(needs a CUDA GPU). A row is ``[fa3/]variant:len:head_dim[:param=value...]``; ``fa3/`` times
FlashInfer's FA3 single prefill on the same inputs instead (causal, softcap with ``cap``,
sliding_window with ``window``). Prints one JSON line per row. ``--cooldown S`` (default 1)
leaves the GPU idle for S seconds before each timing: under its power cap the card lowers its
clocks after a busy stretch, which would otherwise favour the rows timed first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict


def stream_ms(fn, reps: int = 20) -> float:
    """Milliseconds per call of ``reps`` calls queued back to back."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _kernel_ms(run, reps: int = 20) -> dict[str, float]:
    """Median device milliseconds of each kernel name of ``run()``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            times[e.name[:60]].append(e.time_range.elapsed_us() / 1e3)
    return {name: statistics.median(t) * len(t) / reps for name, t in times.items()}


FA3_PREFIX = "fa3/"
FA3_VARIANTS = ("causal", "softcap", "sliding_window")


def parse_row(spec: str) -> tuple[str, int, int, dict[str, int | float]]:
    """``[fa3/]variant:len:head_dim[:param=value...]`` as (variant, len, head_dim, params); a
    ValueError names the part that is wrong."""
    if spec.startswith(FA3_PREFIX):
        name = spec[len(FA3_PREFIX) :].split(":")[0]
        if name not in FA3_VARIANTS:
            raise ValueError(f"--rows: {spec!r}: fa3/ rows are {', '.join(FA3_VARIANTS)}")
    parts = spec.removeprefix(FA3_PREFIX).split(":")
    if len(parts) < 3:
        raise ValueError(f"--rows: {spec!r} is not variant:len:head_dim[:param=value...]")
    name, n_text, d_text, *assignments = parts
    if not (n_text.isdigit() and d_text.isdigit()) or int(n_text) < 1 or int(d_text) < 1:
        raise ValueError(f"--rows: {spec!r}: len and head_dim must be positive integers")
    params: dict[str, int | float] = {}
    for a in assignments:
        key, eq, value = a.partition("=")
        try:
            params[key] = float(value) if "." in value else int(value)
        except ValueError:
            eq = ""
        if not eq or not key:
            raise ValueError(f"--rows: {spec!r}: {a!r} is not param=number")
    return name, int(n_text), int(d_text), params


def check_rows(ap: argparse.ArgumentParser, rows: str) -> None:
    """Every comma-separated row of ``rows`` parses (parse_row), else an argparse error (exit
    2) naming the part that is wrong, before any GPU work."""
    for spec in rows.split(","):
        try:
            parse_row(spec)
        except ValueError as exc:
            ap.error(str(exc))


def planned_run(spec: str, backend: str):
    """``run()`` of one planned row (``variant:len:hd[:param=value]``: one request of random
    bf16 inputs, 32/8 heads), ready to call; the probes time it."""
    import torch

    import attnc

    name, n, d, params = parse_row(spec)
    hq, hkv = 32, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    variant = attnc.load(f"stdlib:{name}")
    if spec.startswith(FA3_PREFIX):
        return _fa3_run(name, _with_defaults(spec, variant, params), q, k, v)
    wrapper = attnc.BatchPrefillWrapper(
        variant, torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend=backend
    )
    indptr = torch.tensor([0, n], dtype=torch.int32)
    wrapper.plan(indptr, indptr, hq, hkv, d, dtype=torch.bfloat16, params=params or None)

    values = {**params, **probe_tensor_params(name, hq, "cuda")}

    def run():
        return wrapper.run(q, (k, v), **values)

    return run


def probe_tensor_params(name: str, num_qo_heads: int, device: str) -> dict[str, object]:
    """The tensor params a probe row cannot spell as ``param=number``: ALiBi's standard
    slopes (as the prefill suite passes them), gpt_oss_local's sink logits (one per head,
    seeded); other variants need none."""
    import torch

    from benchmarks.inputs import alibi_slopes

    if name == "alibi":
        return {"slopes": alibi_slopes(num_qo_heads, device)}
    if name == "gpt_oss_local":
        gen = torch.Generator(device=device).manual_seed(1)
        sinks = torch.randn(num_qo_heads, device=device, dtype=torch.float32, generator=gen)
        return {"sinks": sinks}
    return {}


def _with_defaults(spec: str, variant, params: dict[str, int | float]) -> dict[str, object]:
    """The row's params over the stdlib variant's defaults (so an fa3/ row computes what the
    attnc row of the same spec does); a ValueError names a param with neither."""
    values: dict[str, object] = {p.name: p.default for p in variant.params if p.default is not None}
    values.update(params)
    missing = [p.name for p in variant.params if p.name not in values]
    if missing:
        raise ValueError(f"--rows: {spec!r}: give {', '.join(missing)} (no default)")
    return values


def _fa3_run(name: str, values: dict[str, object], q, k, v):
    """FlashInfer FA3's single prefill of the row (causal, with the row's cap or window)."""
    import flashinfer

    kwargs: dict[str, object] = {}
    if name == "softcap":
        kwargs["logits_soft_cap"] = float(values["cap"])  # type: ignore[arg-type]
    if name == "sliding_window":
        kwargs["window_left"] = int(values["window"]) - 1  # type: ignore[call-overload]

    def run():
        return flashinfer.single_prefill_with_kv_cache(
            q, k, v, causal=True, backend="fa3", **kwargs
        )

    return run


def _row(spec: str, backend: str, ncu: bool = False, cooldown: float = 0.0) -> dict:
    import torch
    from triton import testing

    run = planned_run(spec, backend)
    if ncu:  # under Nsight Compute: a few launches, no timing
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        return {"row": spec, "backend": backend, "ncu": True}
    run()
    torch.cuda.synchronize()
    time.sleep(cooldown)
    flush_ms = testing.do_bench(run, warmup=25, rep=100, return_mode="median")
    time.sleep(cooldown)
    queued_ms = stream_ms(run)
    time.sleep(cooldown)
    kernels = _kernel_ms(run)
    return {
        "row": spec, "backend": backend,
        "ms_do_bench_flush": round(flush_ms, 4), "ms_stream": round(queued_ms, 4),
        "ms_kernels": {k: round(v, 4) for k, v in kernels.items()},
        "ms_kernels_sum": round(sum(kernels.values()), 4),
    }  # fmt: skip


def main() -> None:
    """Parse the arguments, time each row, print JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="causal:8192:128")
    ap.add_argument("--backend", default="sm90")
    ap.add_argument("--ncu", action="store_true", help="launch only (under Nsight Compute)")
    ap.add_argument(
        "--cooldown",
        type=float,
        default=1.0,
        help="seconds of idle GPU before each timing (the card lowers its clocks under load)",
    )
    args = ap.parse_args()
    from benchmarks.timing import pause_error

    bad_pause = pause_error(args.cooldown)
    if bad_pause is not None:
        ap.error(bad_pause)
    check_rows(ap, args.rows)
    for spec in args.rows.split(","):
        print(json.dumps(_row(spec, args.backend, args.ncu, args.cooldown)), flush=True)


if __name__ == "__main__":
    main()
