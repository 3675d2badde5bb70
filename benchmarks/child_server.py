"""The anchor child process: FA4 and FlexAttention's FLASH backend, measured on request.

Owns: the child side of the anchor-child protocol. FA4 (flash-attn-4 on the CuTe DSL) needs
apache-tvm-ffi 0.1.11, FlashInfer 0.5.3 needs 0.1.6; one process cannot import both, so the
parent (``child_systems.py``) starts ``python -m benchmarks.child_server`` with FA4's folders
first on ``PYTHONPATH`` and sends it one JSON request per line on stdin:

    {"system": "fa4" | "flex_flash", "case": {...}, "rep": ms, "out": path, "autotune": bool}

For each request the child makes the row's input sets exactly as the parent does (same
seeds, ``inputs.make_prefill_sets``), runs the system once per set (compiles included),
saves set 0's output (``[q_len, H, D]``) to ``path`` for the parent's cross-check, times the
calls with ``timing.bench_ms`` and answers on one line that starts with ``REPLY_PREFIX``:

    {"status": "ok", "ms": ..., "note": ..., "timing_note": ..., "compare": bool}
    {"status": "missing" | "n/a" | "error", "note": reason}

``note`` is what the system says of its call (the Prepared's note, e.g. ``score_mod,
pack_gqa off``), ``timing_note`` what the timing says of itself; the parent shows each once.

The child keeps the prepared input sets of the current row, per system. A request with
``"retime": true`` and no ``out`` for a system and case it holds times those sets again (the
suite's rounds: every system of a row is timed once per round); a request for another row
drops every kept set first.

Its first line is ``{"ready": true, "missing": "" | reason}`` (reason: FA4 not importable).
Anything else the libraries print goes to stderr. The child exits at the end of stdin or
when its parent is gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

REPLY_PREFIX = "@@bench-child "


def case_to_dict(case) -> dict:
    """A prefill case as plain JSON data."""
    from dataclasses import asdict

    return asdict(case)


def case_from_dict(data: dict):
    """The PrefillCase that ``case_to_dict`` wrote."""
    from benchmarks.workloads import Mask, PrefillCase, VariantSpec

    v = data["variant"]
    params = tuple((str(k), val) for k, val in v["params"])
    variant = VariantSpec(v["label"], v["stdlib"], Mask(**v["mask"]), params)
    rest = {k: val for k, val in data.items() if k != "variant"}
    return PrefillCase(variant, **rest)


def make_system(name: str, autotune: bool = False):
    """The system a request names (imports nothing heavy by itself)."""
    if name == "fa4":
        from benchmarks.fa4_anchor import Fa4Prefill

        return Fa4Prefill()
    if name == "flex_flash":
        from benchmarks.flex_anchor import FlexPrefill

        return FlexPrefill(autotune, flash=True)
    raise ValueError(f"unknown child system {name!r}")


def probe() -> str:
    """'' when FA4 imports here, else the reason (shown as the anchors' missing cells)."""
    try:
        import torch

        torch.cuda.init()
        from flash_attn.cute.interface import flash_attn_func  # noqa: F401
    except Exception as exc:
        traceback.print_exc()
        msg = str(exc).strip().splitlines()
        return f"flash-attn-4 not importable: {type(exc).__name__}: {msg[0] if msg else ''}"[:120]
    return ""


# The prepared input sets of the current row (its case as JSON): Prepared lists per
# (system, autotune), so that both child systems of a row (fa4, flex_flash) can be timed again.
_KEPT: dict[str, Any] = {"case": "", "systems": {}}


def _keys(request: dict) -> tuple[str, str]:
    case = json.dumps(request["case"], sort_keys=True)
    return case, json.dumps([request["system"], bool(request.get("autotune", False))])


def _prepared(request: dict) -> list:
    """The system's Prepared per input set: the kept ones for a retime of the current row,
    else made afresh. A request for another row drops every kept set first, so two rows
    never hold memory together."""
    case_key, system_key = _keys(request)
    kept = _KEPT["systems"] if _KEPT["case"] == case_key else {}
    if request.get("retime"):
        if system_key not in kept:
            raise ValueError(
                f"retime: the child does not hold {request['system']!r} on this row "
                "(prepare it first)"
            )
        return kept[system_key]
    if _KEPT["case"] != case_key:
        _KEPT["case"], _KEPT["systems"] = case_key, {}
    _KEPT["systems"].pop(system_key, None)
    from benchmarks.inputs import make_prefill_sets

    case = case_from_dict(request["case"])
    system = make_system(request["system"], bool(request.get("autotune", False)))
    preps = [system.prepare(case, data) for data in make_prefill_sets(case)]
    _KEPT["systems"][system_key] = preps
    return preps


def _run_and_time(request: dict) -> dict:
    """Prepare (or take the kept sets of a retime), run, save the output of set 0 when asked
    (``out``) and time one system on one row."""
    import torch

    from benchmarks.timing import bench_ms

    preps = _prepared(request)
    if "out" in request:
        out = preps[0].canon(preps[0].run())
        for prep in preps[1:]:
            prep.run()
        torch.cuda.synchronize()
        torch.save(out.contiguous().cpu(), request["out"])
        del out
    ms, timing_note = bench_ms([p.run for p in preps], graph=False, rep=int(request["rep"]))
    return {
        "status": "ok",
        "ms": ms,
        "note": preps[0].note,
        "timing_note": timing_note,
        "compare": preps[0].compare,
    }


def measure(request: dict) -> dict:
    """The reply to one request; a failure becomes its status and reason, never an exit."""
    import torch

    from benchmarks.outcome import from_exception

    try:
        reply = _run_and_time(request)
    except Exception as exc:
        traceback.print_exc()
        outcome = from_exception(exc)
        reply = {"status": outcome.status, "note": outcome.note}
    torch.cuda.empty_cache()
    return reply


def _exit_with_parent(parent: int) -> None:
    """Leave when the parent is gone (a killed parent does not close a busy child)."""
    while True:
        time.sleep(2.0)
        if os.getppid() != parent:
            os._exit(3)


def main() -> int:
    """Answer requests from stdin until it ends."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library prints go to stderr

    def reply(data: dict) -> None:
        replies.write(REPLY_PREFIX + json.dumps(data) + "\n")
        replies.flush()

    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    missing = probe()
    reply({"ready": True, "missing": missing})
    for line in sys.stdin:
        if not line.strip():
            continue
        if missing:
            reply({"status": "missing", "note": missing})
            continue
        reply(measure(json.loads(line)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
