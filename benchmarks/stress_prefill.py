"""Repeats each benchmark variant's 8K prefill many times, each variant in a child process
with a deadline, to catch kernels that hang, fail or race only now and then (a single call,
as in most GPU tests, can pass). The kernels are deterministic, so the last call's output
must equal the first bit for bit. Prints one line per variant: ``ok`` with the calls and the
mean milliseconds per call, ``HANG`` when the child missed its deadline, ``DIFFERS`` when
the last output is not the first, or ``FAIL`` with the child's last error line.

    python -m benchmarks.stress_prefill [--variants causal,prefix_lm] [--calls 300]
        [--backend auto|sm90|fa2] [--deadline 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchmarks.workloads import VARIANTS


def child(name: str, calls: int, backend: str) -> None:
    """Plan one 8K request of variant ``name`` and call ``run()`` ``calls`` times."""
    import torch

    import attnc
    from benchmarks.inputs import variant_params

    spec = VARIANTS[name]
    n, hq, hkv, d = 8192, 32, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    params = variant_params(spec, hq)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = attnc.BatchPrefillWrapper(attnc.load(f"stdlib:{spec.stdlib}"), ws, backend=backend)
    indptr = torch.tensor([0, n], dtype=torch.int32)
    wrapper.plan(indptr, indptr, hq, hkv, d, dtype=torch.bfloat16, params=spec.scalar_params)
    first = wrapper.run(q, (k, v), **params).clone()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        out = wrapper.run(q, (k, v), **params)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3 / calls
    same = torch.equal(out.view(torch.int16), first.view(torch.int16))  # NaN-safe, bitwise
    print(f"{ms:.4f} {'same' if same else 'differs'}", flush=True)


def main() -> None:
    """Run every requested variant in its own child process and report each."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds per variant")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.calls, args.backend)
        return
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or args.calls < 1 or not args.deadline > 0:
        ap.error(
            f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})"
            if unknown
            else "--calls must be >= 1 and --deadline > 0"
        )
    for name in names:
        cmd = [sys.executable, "-m", "benchmarks.stress_prefill", "--child", name,
               "--calls", str(args.calls), "--backend", args.backend]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.deadline)
        except subprocess.TimeoutExpired:
            print(f"{name:16} HANG: {args.calls} calls did not finish in {args.deadline:.0f} s")
            continue
        out, err = done.stdout.strip().splitlines(), done.stderr.strip().splitlines()
        words = out[-1].split() if out else []
        if done.returncode != 0 or len(words) != 2:
            print(f"{name:16} FAIL: {err[-1] if err else f'exit {done.returncode}'}")
        elif words[1] != "same":
            print(f"{name:16} DIFFERS: the output of call {args.calls + 1} is not the first's")
        else:
            print(f"{name:16} ok: {args.calls} calls, {words[0]} ms per call")


if __name__ == "__main__":
    main()
