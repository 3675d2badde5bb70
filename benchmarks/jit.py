"""The jit suite: first-call time of a new variant (cold cache) and of a cached load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks.outcome import Outcome
from benchmarks.results import Results

CHILD_TIMEOUT_S = 540


def run_child(which: str, env_extra: dict[str, str], timeout: float = CHILD_TIMEOUT_S) -> Outcome:
    """Run ``benchmarks.jit_child`` in a fresh process; seconds in ``value``."""
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-m", "benchmarks.jit_child", which]
    timeout = max(1.0, timeout)
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Outcome("error", note=f"timeout after {timeout:.0f} s (time budget)")
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome("error", note=f"exit {proc.returncode}: {tail[:100]}")
    result = json.loads(lines[-1])
    if "error" in result:
        return Outcome("error", note=result["error"])
    extra = {k: round(v, 3) for k, v in result.items() if k != "total_s"}
    note = ", ".join(f"{k} {v}" for k, v in extra.items())
    return Outcome("ok", value=float(result["total_s"]), note=note)


def _child_timeout(args) -> float:
    """Seconds a child may take: the suite's time left, at most CHILD_TIMEOUT_S."""
    deadline = getattr(args, "deadline", None)
    if deadline is None:
        return CHILD_TIMEOUT_S
    return min(CHILD_TIMEOUT_S, deadline - time.monotonic())


def run_jit(args, results: Results, log: Callable = print) -> None:
    """A variant given as text (not a stdlib name), in fresh processes: attnc's cold build
    (empty ``ATTNC_CACHE_DIR``) then its warm load from that cache; FlexAttention's first-call
    compile (empty Inductor/Triton caches) then with those caches filled, as the anchor."""
    attnc_cache = tempfile.mkdtemp(prefix="attnc_jit_")
    flex_cache = tempfile.mkdtemp(prefix="inductor_jit_")
    attnc_env = {"ATTNC_CACHE_DIR": attnc_cache}
    flex_env = {"TORCHINDUCTOR_CACHE_DIR": flex_cache, "TRITON_CACHE_DIR": flex_cache + "/triton"}
    rows = [
        ("first call, new variant, empty cache (build)", "cold"),
        ("first call, new variant, filled cache (load)", "warm"),
    ]
    for label, phase in rows:
        if getattr(args, "deadline", None) is not None and _child_timeout(args) <= 1:
            note = f"jit: row '{label}' not run (time budget)"
            log(note)
            results.data["meta"].setdefault("notes", []).append(note)
            continue
        log(f"[jit] {label}")
        outcomes = {"attnc": run_child("attnc", attnc_env, _child_timeout(args))}
        if "flex" not in args.skip:
            outcomes["flex"] = run_child("flex", flex_env, _child_timeout(args))
        for name, out in outcomes.items():
            log(f"  {name}: {out.status} {out.value} {out.note}")
        results.add_row("jit", f"{label} ({phase})", "s", outcomes, higher=False)
