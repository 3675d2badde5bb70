"""Command line: ``python -m benchmarks --suite prefill|decode|batch|jit|all``."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

SUITES = ("prefill", "decode", "batch", "jit")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (works without torch, triton or a GPU)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="attnc against FlexAttention, SDPA (cuDNN, FA2) and FlashInfer on one GPU.",
    )
    p.add_argument(
        "--suite",
        nargs="+",
        default=["prefill"],
        choices=[*SUITES, "all"],
        help="suites to run (several allowed)",
    )
    p.add_argument("--quick", action="store_true", help="one or two rows per suite")
    p.add_argument("--out", default="bench_out", help="folder for bench.json, bench.md, plots")
    p.add_argument(
        "--autotune",
        action="store_true",
        help="compile FlexAttention with max-autotune-no-cudagraphs (slow)",
    )
    p.add_argument("--only", default=None, help="keep rows whose name contains this text")
    p.add_argument("--skip", default="", help="comma-separated systems to leave out")
    p.add_argument("--rep", type=int, default=None, help="timing budget per system in ms")
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds after which no new row is started (0: no limit)",
    )
    args = p.parse_args(argv)
    args.suites = list(SUITES) if "all" in args.suite else list(dict.fromkeys(args.suite))
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.deadline = time.monotonic() + args.budget if args.budget > 0 else None
    if args.rep is None:
        args.rep = 50 if args.quick else 100
    return args


def log(msg: str) -> None:
    """Progress line, flushed at once."""
    print(msg, flush=True)


def _versions() -> dict:
    import torch

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    for mod in ("triton", "flashinfer"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception as exc:
            meta[mod] = f"missing ({type(exc).__name__})"
    return meta


def _run_suite(name: str, args, results) -> None:
    from benchmarks import jit, suites

    runner = {
        "prefill": suites.run_prefill,
        "decode": suites.run_decode,
        "batch": suites.run_batch,
        "jit": jit.run_jit,
    }[name]
    try:
        runner(args, results, log)
    except Exception as exc:
        traceback.print_exc()
        results.data["meta"].setdefault("notes", []).append(f"suite {name} stopped: {exc!r}"[:200])
        results.save()


def _plots(args, results) -> None:
    from benchmarks.plot import write_plot

    notes = results.data["meta"].setdefault("notes", [])
    for name, rows in results.data["suites"].items():
        if name != "jit" and rows:
            notes.append(write_plot(name, rows, os.path.join(args.out, f"bench_{name}.png")))
    results.save()


def main(argv: list[str] | None = None) -> int:
    """Run the chosen suites, save results after each row, print the tables last."""
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU; none found", file=sys.stderr)
        return 2
    from benchmarks import ceilings
    from benchmarks.results import Results

    meta = _versions()
    meta["notes"] = (
        []
        if args.autotune
        else [
            "FlexAttention compiled in default mode: ANCHORS.md's max-autotune figures are not "
            "re-measured here (use --autotune)"
        ]
    )
    results = Results(args.out, meta)
    if any(s != "jit" for s in args.suites):
        log("[ceilings]")
        results.set_ceilings(ceilings.measure(args.quick))
        log(f"  {results.data['ceilings']}")
    for name in args.suites:
        _run_suite(name, args, results)
    _plots(args, results)
    with open(os.path.join(args.out, "bench.md")) as f:
        print(f.read(), flush=True)
    return 0
