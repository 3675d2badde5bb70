"""The prefill, decode and batch suites: build rows, measure, collect."""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks import flops, workloads
from benchmarks.results import Results

PREFILL_UNIT = "TFLOP/s"
DECODE_UNIT = "TB/s"


def _keep(systems: list, args) -> list:
    """Systems not in --skip; those left out by default become NotRun (shown as missing; the
    reason is in the report's notes, once)."""
    from benchmarks.system import NotRun

    not_run = getattr(args, "not_run", {})
    return [
        NotRun(s.name, "not run, see the notes") if s.name in not_run else s
        for s in systems
        if s.name not in args.skip
    ]


def time_left(args) -> Callable[[], float | None]:
    """Seconds left in the running suite (None: no limit), read when a system asks."""

    def left() -> float | None:
        clock = getattr(args, "clock", None)
        return None if clock is None else clock.left()

    return left


def prefill_systems(args) -> list:
    """Anchors first (the first available one is the reference), attnc last: one attnc system
    per prefill backend when the runtime takes ``backend=``. FA4 and the FLASH backend run in
    the anchor child process (``child_systems.py``)."""
    from benchmarks.attnc_systems import AttncPrefill, prefill_backends
    from benchmarks.child_systems import ChildPrefill
    from benchmarks.flashinfer_anchor import FlashInferSingle
    from benchmarks.flex_anchor import FlexPrefill
    from benchmarks.sdpa_anchor import SdpaPrefill

    autotune, left = getattr(args, "autotune", False), time_left(args)
    return [
        FlashInferSingle("fa3", left),
        FlashInferSingle("fa2"),
        ChildPrefill("fa4", args.rep, left),
        FlexPrefill(autotune),
        ChildPrefill("flex_flash", args.rep, left, autotune),
        SdpaPrefill("cudnn"),
        SdpaPrefill("flash"),
        *[AttncPrefill(backend) for backend in prefill_backends()],
    ]


def decode_systems(autotune: bool, dense: bool = True) -> list:
    """FlashInfer tensor-core and CUDA-core decode, Flex (dense KV), attnc."""
    from benchmarks.attnc_systems import AttncDecode
    from benchmarks.flashinfer_anchor import FlashInferDecode
    from benchmarks.flex_anchor import FlexDecode

    systems: list = [FlashInferDecode(True), FlashInferDecode(False)]
    if dense:
        systems.append(FlexDecode(autotune))
    return systems + [AttncDecode()]


def batch_prefill_systems(args=None) -> list:
    """FlashInfer paged prefill (FA3, FA2) and attnc's BatchPrefillWrapper (one per prefill
    backend when the runtime takes ``backend=``)."""
    from benchmarks.attnc_systems import AttncBatchPrefill, prefill_backends
    from benchmarks.flashinfer_anchor import FlashInferBatchPrefill

    left = time_left(args)
    return [
        FlashInferBatchPrefill("fa3", left),
        FlashInferBatchPrefill("fa2"),
        *[AttncBatchPrefill(backend) for backend in prefill_backends(batch=True)],
    ]


def _measure(case, systems: list, sets: list, work: float, args, log: Callable) -> dict:
    """``measure_case`` with the run's timing settings (``--rep``, ``--cooldown``,
    ``--rounds``)."""
    from benchmarks.measure import measure_case

    return measure_case(
        case,
        systems,
        sets,
        work,
        rep=args.rep,
        log=log,
        cooldown_s=float(getattr(args, "cooldown", 0.0) or 0.0),
        rounds=getattr(args, "rounds", 1),
    )


def _free() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def _prefill_row(case, args, results: Results, log: Callable) -> None:
    from benchmarks.inputs import make_prefill_sets

    sets = make_prefill_sets(case)
    work = flops.prefill_flops(
        case.variant.mask, case.q_len, case.kv_len, case.num_qo_heads, case.head_dim
    )
    systems = _keep(prefill_systems(args), args)
    outcomes = _measure(case, systems, sets, work, args, log)
    results.add_row("prefill", case.name, PREFILL_UNIT, outcomes, work=work)
    del sets
    _free()


def _decode_row(suite: str, case, args, results: Results, log: Callable) -> None:
    from benchmarks.inputs import make_paged

    dense = len(set(case.kv_lens)) == 1
    data = make_paged(case, [1] * len(case.kv_lens), seed=0, dense=dense)
    work = flops.decode_kv_bytes(
        case.kv_lens, case.num_kv_heads, case.head_dim, mask=case.variant.mask
    )
    systems = _keep(decode_systems(args.autotune, dense), args)
    outcomes = _measure(case, systems, [data], work, args, log)
    results.add_row(suite, case.name, DECODE_UNIT, outcomes, work=work)
    del data
    _free()


def _batch_prefill_row(case, args, results: Results, log: Callable) -> None:
    from benchmarks.inputs import make_paged

    data = make_paged(case, list(case.lens), seed=0)
    work = flops.batch_prefill_flops(case.variant.mask, case.lens, case.num_qo_heads, case.head_dim)
    systems = _keep(batch_prefill_systems(args), args)
    outcomes = _measure(case, systems, [data], work, args, log)
    results.add_row("batch", case.name, PREFILL_UNIT, outcomes, work=work)
    del data
    _free()


def only_texts(only: str | None) -> list[str]:
    """The ``|``-separated texts of ``--only`` (none: every row); a row matches a text that is
    in its name, ignoring case."""
    return [t.strip() for t in (only or "").split("|") if t.strip()]


def _selected(cases: list, only: str | None) -> list:
    """Cases whose name contains one of the texts of ``only`` (all if None)."""
    texts = [t.lower() for t in only_texts(only)]
    if not texts:
        return cases
    return [c for c in cases if any(t in c.name.lower() for t in texts)]


def out_of_time(args, suite: str, case, results: Results, log: Callable) -> bool:
    """True (and a note in the report) once the suite's time is up (see budget.py)."""
    deadline = getattr(args, "deadline", None)
    clock = getattr(args, "clock", None)
    late = deadline is not None and time.monotonic() >= deadline
    if not late and (clock is None or clock.may_start()):
        return False
    note = f"{suite}: row '{case.name}' not run (time budget)"
    log(note)
    results.data["meta"].setdefault("notes", []).append(note)
    results.save()
    return True


def run_rows(suite: str, cases: list, args, results: Results, log: Callable, row: Callable) -> None:
    """``row(case)`` for every selected case that fits the suite's time budget."""
    clock = getattr(args, "clock", None)
    for case in _selected(cases, args.only):
        if out_of_time(args, suite, case, results, log):
            continue
        log(f"[{suite}] {case.name}")
        if clock is not None:
            clock.start()
        try:
            row(case)
        finally:
            if clock is not None:
                clock.stop()


def _profile(args) -> dict:
    return {"quick": args.quick, "full": getattr(args, "full", True)}


def run_prefill(args, results: Results, log: Callable = print) -> None:
    """Single-request prefill rows (the anchor child starts first, so that its imports
    overlap the first rows)."""
    from benchmarks.child_systems import CHILD_SYSTEMS, shut_down, warm_up

    if any(name not in args.skip for name in CHILD_SYSTEMS):
        warm_up()
    cases = workloads.prefill_cases(**_profile(args))
    try:
        run_rows(
            "prefill", cases, args, results, log, lambda c: _prefill_row(c, args, results, log)
        )
    finally:
        shut_down()  # no idle process (nor its CUDA context) during the later suites


def run_decode(args, results: Results, log: Callable = print) -> None:
    """Batch 64 x 4096 paged decode rows."""
    cases = workloads.decode_cases(**_profile(args))
    run_rows(
        "decode", cases, args, results, log, lambda c: _decode_row("decode", c, args, results, log)
    )


def run_batch(args, results: Results, log: Callable = print) -> None:
    """Skewed batches: decode_zipf, decode_uniform, prefill_zipf."""

    def row(case) -> None:
        if isinstance(case, workloads.DecodeCase):
            _decode_row("batch", case, args, results, log)
        else:
            _batch_prefill_row(case, args, results, log)

    run_rows("batch", workloads.batch_cases(args.quick), args, results, log, row)
