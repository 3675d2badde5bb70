"""Command line: ``python -m benchmarks --suite prefill|decode|host|batch|jit|all``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback

SUITES = ("prefill", "decode", "host", "batch", "jit")
PROFILES = ("quick", "fast", "full")
REP_MS = {"quick": 25, "fast": 40, "full": 100}
FA3_NOTE = "not run (--no-fa3); its JIT build takes ~50 s a variant"
# Every system a suite can time (the names of the report's columns), and the short names --skip
# also takes for the ones with long names. "flash" alone is refused: it could mean FlexAttention's
# FLASH backend (flex_flash) or SDPA's FlashAttention (sdpa_flash).
SYSTEM_NAMES = (
    "flashinfer_fa3", "flashinfer_fa2", "flashinfer_tc", "flashinfer_cc", "fa4", "flex",
    "flex_flash", "sdpa_cudnn", "sdpa_flash", "attnc", "attnc-fa2", "attnc-sm90",
)  # fmt: skip
SKIP_ALIASES = {"fa3": "flashinfer_fa3", "fa2": "flashinfer_fa2", "cudnn": "sdpa_cudnn"}
AMBIGUOUS_SKIPS = {"flash": ("flex_flash", "sdpa_flash")}


# Named sets of arguments; ``--preset NAME`` stands for them where it is written, so arguments
# after it override them. ``targets``: issue 12's table side by side with the anchors (the rows
# of RESULTS.md's side-by-side runs), each system twice per row in alternating order.
PRESETS: dict[str, tuple[str, ...]] = {
    "targets": (
        "--suite", "prefill", "batch", "--full",
        "--only", "causal, L=8192|soft-cap 30, L=8192|ALiBi, L=8192|sliding window 1024, "
        "L=8192|sigmoid, L=8192|prefix-LM 1024, L=8192|causal, L=2048|prefill_zipf",
        "--skip", "fa2,flex,flex_flash,sdpa_flash,sdpa_cudnn,attnc-fa2",
        "--cooldown", "1", "--rounds", "2",
    ),
}  # fmt: skip


def expand_presets(argv: list[str]) -> list[str]:
    """``argv`` with each ``--preset NAME`` (or ``--preset=NAME``) replaced by its arguments;
    an unknown or missing name is left for argparse to refuse."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = None
        if arg == "--preset" and i + 1 < len(argv):
            name, step = argv[i + 1], 2
        elif arg.startswith("--preset="):
            name, step = arg.split("=", 1)[1], 1
        if name in PRESETS:
            out += PRESETS[name]
            i += step
            continue
        out.append(arg)
        i += 1
    return out


class TimeUp(BaseException):
    """SIGTERM (e.g. from ``timeout``): stop measuring, keep and print what was measured."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (works without torch, triton or a GPU)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="attnc against FlexAttention, SDPA (cuDNN, FA2) and FlashInfer on one GPU.",
    )
    p.add_argument(
        "--suite",
        nargs="+",
        default=["all"],
        choices=[*SUITES, "all"],
        help="suites to run (several allowed; default all)",
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="fast",
        help="rows and repetitions: quick (one or two rows a suite), fast (default: the main "
        "rows, ~5 minutes on an H200 for all suites), full (every row, longer timing)",
    )
    p.add_argument("--quick", dest="profile", action="store_const", const="quick")
    p.add_argument("--fast", dest="profile", action="store_const", const="fast")
    p.add_argument("--full", dest="profile", action="store_const", const="full")
    p.add_argument(
        "--no-fa3",
        dest="fa3",
        action="store_false",
        help="leave FlashInfer FA3 out (shown as missing; its JIT build takes ~50 s a variant, "
        "and a build that would not fit the suite's time left is skipped anyway)",
    )
    p.add_argument("--fa3", action="store_true", default=True, help=argparse.SUPPRESS)
    p.add_argument("--out", default="bench_out", help="folder for bench.json, bench.md, plots")
    p.add_argument(
        "--autotune",
        action="store_true",
        help="compile FlexAttention with max-autotune-no-cudagraphs (slow)",
    )
    p.add_argument(
        "--only",
        default=None,
        help="keep rows whose name contains this text (several: separate them with |)",
    )
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated systems to leave out (e.g. fa3, fa4, flex_flash, attnc-fa2)",
    )
    p.add_argument(
        "--rep", type=int, default=None, help="timing budget per system in ms (default by profile)"
    )
    p.add_argument(
        "--cooldown",
        type=float,
        default=1.0,
        help="seconds the GPU is left idle before each system is timed (default 1; 0: none). "
        "Run back to back, an H200 sits at its power cap and lowers its clocks, so without a "
        "pause the systems timed last in a row (attnc) lose to the ones timed first",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every system of a row this many times, in column order then in reverse "
        "(alternating), and report the median (default 1)",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named set of arguments, standing where it is written (later ones override "
        "it); targets: issue 12's table side by side with the anchors (the prefill rows at "
        "8K, causal 2K, prefill_zipf; full profile, two alternating rounds)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="total seconds for the run, split over the suites; no row starts after its "
        "suite's share (0: no limit)",
    )
    args = p.parse_args(expand_presets(sys.argv[1:] if argv is None else list(argv)))
    args.suites = list(SUITES) if "all" in args.suite else list(dict.fromkeys(args.suite))
    args.skip, skip_error = skipped_systems(args.skip)
    if skip_error is not None:
        p.error(skip_error)
    args.quick = args.profile == "quick"
    args.full = args.profile == "full"
    # Systems left out by default are shown as missing (with the reason), not dropped.
    args.not_run = {} if args.fa3 or "flashinfer_fa3" in args.skip else {"flashinfer_fa3": FA3_NOTE}
    args.end = time.monotonic() + args.budget if args.budget > 0 else None
    args.deadline = args.end
    if args.rep is None:
        args.rep = REP_MS[args.profile]
    from benchmarks.timing import pause_error

    bad_pause = pause_error(args.cooldown)
    if bad_pause is not None:
        p.error(bad_pause)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    only_error = unmatched_only(args)
    if only_error is not None:
        p.error(only_error)
    return args


def row_names(args: argparse.Namespace) -> list[str]:
    """The rows --only chooses from: those of the selected prefill, decode and batch suites in
    the chosen profile (the host and jit suites take no --only)."""
    from benchmarks import workloads

    profile = {"quick": args.quick, "full": args.full}
    cases: list = []
    if "prefill" in args.suites:
        cases += workloads.prefill_cases(**profile)
    if "decode" in args.suites:
        cases += workloads.decode_cases(**profile)
    if "batch" in args.suites:
        cases += workloads.batch_cases(args.quick)
    return [c.name for c in cases]


def unmatched_only(args: argparse.Namespace) -> str | None:
    """An error naming the first text of --only that is in no row name of the run (a typo, or
    a row of another profile, would otherwise time nothing and say nothing), or None."""
    from benchmarks.suites import only_texts

    rows = row_names(args)
    if not rows:
        return None  # only suites without rows (host, jit) selected: --only is not used
    for text in only_texts(args.only):
        if not any(text.lower() in name.lower() for name in rows):
            return f"--only: {text!r} is in no row of the {args.profile} profile; rows: " + (
                "; ".join(rows)
            )
    return None


def skipped_systems(text: str) -> tuple[set[str], str | None]:
    """The system names of ``--skip`` (comma-separated names or short names), or an error
    naming the first entry that is unknown or ambiguous."""
    names: set[str] = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if entry in AMBIGUOUS_SKIPS:
            choices = " or ".join(AMBIGUOUS_SKIPS[entry])
            return names, f"--skip: {entry!r} is ambiguous, name {choices}"
        name = SKIP_ALIASES.get(entry, entry)
        if name not in SYSTEM_NAMES:
            known = ", ".join((*SYSTEM_NAMES, *SKIP_ALIASES))
            return names, f"--skip: unknown system {entry!r}; systems: {known}"
        names.add(name)
    return names, None


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
    from benchmarks.child_systems import fa4_versions

    meta["fa4"] = fa4_versions() or "missing"
    return meta


def _note(results, text: str) -> None:
    results.data["meta"].setdefault("notes", []).append(text)
    results.save()


def _run_suite(name: str, args, results) -> None:
    from benchmarks import host, jit, suites
    from benchmarks.budget import SuiteClock, suite_share

    runner = {
        "prefill": suites.run_prefill,
        "decode": suites.run_decode,
        "host": host.run_host,
        "batch": suites.run_batch,
        "jit": jit.run_jit,
    }[name]
    start = time.monotonic()
    if args.end is not None:
        rest = args.suites[args.suites.index(name) :]
        share = suite_share(name, rest, args.end - start)
        args.deadline = start + share
        log(f"[{name}] budget {share:.0f} s")
    args.clock = SuiteClock(args.deadline)
    try:
        runner(args, results, log)
    except Exception as exc:
        traceback.print_exc()
        _note(results, f"suite {name} stopped: {exc!r}"[:200])
    results.data["meta"].setdefault("suite_seconds", {})[name] = round(time.monotonic() - start)
    results.save()


def _plots(args, results) -> None:
    from benchmarks.plot import write_plot

    notes = results.data["meta"].setdefault("notes", [])
    for name, rows in results.data["suites"].items():
        if rows:
            notes.append(write_plot(name, rows, os.path.join(args.out, f"bench_{name}.png")))
    results.save()


def _on_term(signum, frame):
    raise TimeUp()


def main(argv: list[str] | None = None) -> int:
    """Run the chosen suites, save results after each row, print the tables last."""
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU; none found", file=sys.stderr)
        return 2
    from benchmarks import ceilings
    from benchmarks.results import Results

    signal.signal(signal.SIGTERM, _on_term)
    meta = _versions()
    meta["profile"] = args.profile
    meta["cooldown_s"] = args.cooldown
    meta["rounds"] = args.rounds
    meta["notes"] = []
    if not args.autotune:
        meta["notes"].append(
            "FlexAttention compiled in default mode: ANCHORS.md's max-autotune figures are not "
            "re-measured here (use --autotune)"
        )
    for name, why in args.not_run.items():
        meta["notes"].append(f"{name}: {why}")
    if args.budget > 0:
        meta["notes"].append(f"time budget {args.budget:.0f} s for all suites, split per suite")
    results = Results(args.out, meta)
    t0 = time.monotonic()
    try:
        if any(s not in ("jit", "host") for s in args.suites):
            log("[ceilings]")
            results.set_ceilings(ceilings.measure(args.quick))
            log(f"  {results.data['ceilings']}")
        for name in args.suites:
            _run_suite(name, args, results)
    except TimeUp:
        _note(results, "stopped by SIGTERM (time limit): later rows and suites not run")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    results.data["meta"]["total_seconds"] = round(time.monotonic() - t0)
    _plots(args, results)
    with open(os.path.join(args.out, "bench.md")) as f:
        print(f.read(), flush=True)
    return 0
