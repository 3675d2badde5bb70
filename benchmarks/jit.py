"""The jit suite: first-call time of a new variant (cold cache) and of a cached load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from benchmarks.outcome import Outcome
from benchmarks.results import Results

CHILD_TIMEOUT_S = 540


def run_child(which: str, env_extra: dict[str, str]) -> Outcome:
    """Run ``benchmarks.jit_child`` in a fresh process; seconds in ``value``."""
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-m", "benchmarks.jit_child", which]
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return Outcome("error", note=f"timeout after {CHILD_TIMEOUT_S} s")
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


def run_jit(args, results: Results, log: Callable = print) -> None:
    """Cold build then cached load of attnc (softcap); FlexAttention compile, cold then warm."""
    attnc_cache = tempfile.mkdtemp(prefix="attnc_jit_")
    flex_cache = tempfile.mkdtemp(prefix="inductor_jit_")
    attnc_env = {"ATTNC_CACHE_DIR": attnc_cache}
    flex_env = {"TORCHINDUCTOR_CACHE_DIR": flex_cache, "TRITON_CACHE_DIR": flex_cache + "/triton"}
    rows = [("first call, new variant (empty cache)", "cold"), ("cached load + first call", "warm")]
    for label, phase in rows:
        log(f"[jit] {label}")
        outcomes = {"attnc": run_child("attnc", attnc_env)}
        if "flex" not in args.skip:
            outcomes["flex"] = run_child("flex", flex_env)
        for name, out in outcomes.items():
            log(f"  {name}: {out.status} {out.value} {out.note}")
        results.add_row("jit", f"{label} ({phase})", "s", outcomes, higher=False)
