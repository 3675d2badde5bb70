"""Run one row: prepare every system, cross-check outputs, then time those that agree."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from benchmarks.outcome import Outcome, from_exception, short_reason
from benchmarks.system import System
from benchmarks.timing import bench_ms

# The largest relative error between two outputs of one problem. Systems that agree differed
# by at most 3.1e-3 in every stored result (bf16 outputs, any row, suite or system: decode
# 3.1e-3, prefill 3.1e-3, batch 2.6e-3); 1e-2 keeps a threefold margin over that, and is below
# a window of 1024 off by one key on the suite's inputs (1.5e-2 to 2e-2). A soft-cap of 30 left
# out moves those outputs by about 5e-3 only, which no tolerance above the noise can tell: the
# decoy check (decoy.py) tells it.
REL_TOL = 1e-2


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float32; inf for a shape mismatch or a non-finite value."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    a, b = out.float(), ref.float()
    err = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))
    return err if err == err else float("inf")


def _prepare(system: System, case, sets: Sequence) -> tuple[list, object]:
    """Prepare every input set and run each once (JIT build, compiles); set 0's output is kept."""
    import torch

    used = sets[:1] if getattr(system, "timed_elsewhere", False) else sets
    preps = [system.prepare(case, data) for data in used]
    out = preps[0].canon(preps[0].run())
    for prep in preps[1:]:
        prep.run()
    torch.cuda.synchronize()
    return preps, out


def _reference(order: list[str], outputs: dict, attnc_names: set[str]) -> str | None:
    """First anchor with an output, else the first system with one."""
    for name in order:
        if name in outputs and name not in attnc_names:
            return name
    return next((n for n in order if n in outputs), None)


def _check(systems, case, sets, outputs: dict) -> tuple[dict, dict, str | None]:
    """Relative errors and check notes per system; the reference name.

    When no anchor has an output (one attnc system, or attnc's two templates), the
    reference's own ``self_check`` (attnc: its eager reference on blocks of query rows spread
    over the sequence) checks it when it has one; the others are compared with it.
    """
    order = [s.name for s in systems]
    attnc_names = {s.name for s in systems if s.is_attnc}
    ref = _reference(order, outputs, attnc_names)
    errors = {name: rel_err(out, outputs[ref]) for name, out in outputs.items()}
    notes = {name: "" for name in outputs}
    if ref is not None:
        notes[ref] = "reference"
    if ref is not None and (len(outputs) == 1 or ref in attnc_names):
        system = next(s for s in systems if s.name == ref)
        check = getattr(system, "self_check", None)
        notes[ref] = "unchecked"
        if check is not None:
            try:
                errors[ref] = check(case, sets[0], outputs[ref])
                notes[ref] = "vs eager reference, row blocks"
            except Exception as exc:
                notes[ref] = f"unchecked ({short_reason(exc, 60)})"
    return errors, notes, ref


def _decoy_check(case, sets: Sequence, outputs: dict, notes: dict) -> dict:
    """``decoy.decoy_verdicts`` on input set 0: per output name, (pull, mismatch reason or
    ''). When it fails, no verdicts, and each output's note says why it is unchecked."""
    from benchmarks.decoy import decoy_verdicts

    try:
        return decoy_verdicts(case, sets[0] if sets else None, outputs)
    except Exception as exc:
        for name in outputs:
            reason = f"decoy unchecked ({short_reason(exc, 60)})"
            notes[name] = f"{notes[name]}; {reason}" if notes[name] else reason
        return {}


def measure_case(
    case,
    systems: Sequence[System],
    sets: Sequence,
    work: float,
    *,
    rep: int = 100,
    log: Callable[[str], None] = print,
    cooldown_s: float = 0.0,
    rounds: int = 1,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Outcome]:
    """Outcomes per system name; value = work / seconds / 1e12 (TFLOP/s or TB/s).

    ``cooldown_s``: seconds the GPU is left idle before each system is timed (before its
    preparation when it times itself, like the anchor child). Under the card's power cap a
    kernel timed right after other systems runs at lower clocks than one timed after a pause,
    so without it the systems timed last in a row are put at a disadvantage. ``rounds``: the
    systems are timed that many times, in column order, then in reverse, and so on; a
    system's figure is the median of its rounds (a system that times itself, like the anchor
    child, is asked to time the row again in each round when it can; else it is timed once).
    """
    outcomes: dict[str, Outcome] = {}
    prepared: dict[str, list] = {}
    outputs: dict = {}
    for system in systems:
        if cooldown_s > 0 and getattr(system, "timed_elsewhere", False):
            sleep(cooldown_s)
        try:
            prepared[system.name], out = _prepare(system, case, sets)
        except Exception as exc:
            outcomes[system.name] = from_exception(exc)
            log(f"  {system.name}: {outcomes[system.name].status} {outcomes[system.name].note}")
            continue
        if prepared[system.name][0].compare:
            outputs[system.name] = out
        del out
    errors, notes, ref = _check(systems, case, sets, outputs)
    decoys = _decoy_check(case, sets, outputs, notes)
    del outputs
    to_time = []
    for system in systems:
        name = system.name
        if name not in prepared:
            continue
        err = errors.get(name)
        pull, wrong = decoys.get(name, (None, ""))
        if err is not None and err > REL_TOL:
            wrong = f"rel err {err:.2e} {notes[name] if notes[name] else f'vs {ref}'}"
        if wrong:
            outcomes[name] = Outcome("mismatch", note=wrong, rel_err=err, decoy_pull=pull)
            log(f"  {name}: mismatch ({wrong})")
            continue
        to_time.append(system)
    times = _time_rounds(to_time, prepared, rep, max(1, rounds), cooldown_s, sleep)
    for system in to_time:
        name = system.name
        err = errors.get(name)  # None: a stand-in, timed and not compared
        check = (err, notes.get(name, ""), decoys.get(name, (None, ""))[0])
        outcomes[name] = _outcome(times[name], prepared[name], work, check)
        log(f"  {name}: {outcomes[name].status} {outcomes[name].value} {outcomes[name].note}")
    return {s.name: outcomes[s.name] for s in systems}


def _time_rounds(
    systems: list, prepared: dict, rep: int, rounds: int, cooldown_s: float, sleep: Callable
) -> dict[str, list]:
    """Per system name, its (ms, note) per round, or the exception that stopped its timing.
    Round r goes through ``systems`` in order when r is even, in reverse when odd. A system
    measured elsewhere (``timed_ms``) is timed there again in each round when it can be
    (``retime``: the anchor child keeps the row's inputs), else its one figure stands."""
    times: dict[str, list] = {s.name: [] for s in systems}
    for r in range(rounds):
        for system in systems if r % 2 == 0 else systems[::-1]:
            preps, found = prepared[system.name], times[system.name]
            elsewhere = preps[0].timed_ms is not None
            if elsewhere and preps[0].retime is None:
                if not found:
                    found.append((preps[0].timed_ms, ""))
                continue
            if found and isinstance(found[-1], Exception):
                continue
            if cooldown_s > 0:
                sleep(cooldown_s)
            try:
                if elsewhere:
                    found.append(preps[0].retime())
                else:
                    found.append(bench_ms([p.run for p in preps], graph=system.graph, rep=rep))
            except Exception as exc:
                found.append(exc)
    return times


def _outcome(rounds: list, preps: list, work: float, check: tuple):
    """A rate from the median of a system's rounds (see ``_time_rounds``), or the error that
    stopped its timing. ``check``: the output's relative error, check note and decoy pull."""
    err, check_note, pull = check
    failed = [t for t in rounds if isinstance(t, Exception)]
    if failed:
        return Outcome("error", note=short_reason(failed[0]))
    ms = statistics.median(t[0] for t in rounds)
    notes = [n for n in (rounds[0][1], preps[0].note) if n]
    if len(rounds) > 1:
        notes.append(f"median of {len(rounds)} rounds")
    if check_note:
        notes.append(check_note)
    value = work / (ms * 1e-3) / 1e12
    stand_in = not preps[0].compare
    return Outcome(
        "ok", value=value, note="; ".join(notes), rel_err=err, stand_in=stand_in, decoy_pull=pull
    )
