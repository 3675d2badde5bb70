"""Host time of ``BatchPrefillWrapper.run()`` on the CPU, without a GPU: the checks, param
resolution, argument struct and launch call of one eager call, with the module replaced by a
stand-in whose launch only counts calls (``benchmarks.plan_time.stand_in``'s Hopper choice)
and the device checks run for ``cpu`` tensors. One ragged request of ``--tokens`` tokens,
32 query / 8 KV heads, head_dim 128, bf16; mean microseconds per call, with and without
``out=``: ``run`` repeats a call of the plan (the plan's call memo answers), ``checked``
is every call as the plan's first (all checks, then remembered). On a GPU host the launch
itself and the stream query come on top.

    python -m benchmarks.prefill_run_host [--variant causal] [--tokens 2048] [--calls 5000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

import attnc
from attnc.runtime.checks import tensors
from attnc.runtime.wrappers import prefill_launch, prefill_run
from benchmarks.plan_time import stand_in

HQ, HKV, D = 32, 8, 128


@contextmanager
def cpu_checks() -> Iterator[None]:
    """Run the wrapper's device checks for CPU tensors and give the launch stream 0."""
    saved = (
        tensors.check_data_tensor,
        tensors.same_device_index,
        prefill_run.ragged_kv,
        prefill_launch.raw_stream,
    )
    check, ragged = saved[0], saved[2]
    tensors.check_data_tensor = lambda name, t, shape, device_type="cuda": check(
        name, t, shape, "cpu"
    )
    tensors.same_device_index = lambda a, b: True
    prefill_run.ragged_kv = lambda kv, hkv, d, device_type: ragged(kv, hkv, d, "cpu")
    prefill_launch.raw_stream = lambda device: 0
    try:
        yield
    finally:
        (
            tensors.check_data_tensor,
            tensors.same_device_index,
            prefill_run.ragged_kv,
            prefill_launch.raw_stream,
        ) = saved


def mean_us(call: Callable[[], object], calls: int) -> float:
    """Mean microseconds of ``call`` after a warm-up."""
    for _ in range(200):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return 1e6 * (time.perf_counter() - start) / calls


def measure(variant_name: str, tokens: int, calls: int) -> dict[str, float]:
    """Mean us per ``run()`` without and with ``out=``, repeated and as a plan's first call;
    checks that every call launched."""
    variant = attnc.load(f"stdlib:{variant_name}")
    launches = [0]
    with stand_in(variant), cpu_checks():
        wrapper = attnc.BatchPrefillWrapper(variant, torch.empty(128 << 20, dtype=torch.uint8))
        indptr = torch.tensor([0, tokens], dtype=torch.int32)
        wrapper.plan(indptr, indptr, HQ, HKV, D)
        wrapper._module.launch = lambda args, stream: launches.__setitem__(0, launches[0] + 1)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(tokens, HQ, D, generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(tokens, HKV, D, generator=gen).to(torch.bfloat16) for _ in "kv")
        out = torch.empty_like(q)
        memo = wrapper._memo

        def checked(**kw: object) -> None:
            memo.clear()  # every call as the plan's first: all checks, then remembered
            wrapper.run(q, (k, v), **kw)

        result = {
            "run_us": mean_us(lambda: wrapper.run(q, (k, v)), calls),
            "run_out_us": mean_us(lambda: wrapper.run(q, (k, v), out=out), calls),
            "checked_us": mean_us(checked, calls),
            "checked_out_us": mean_us(lambda: checked(out=out), calls),
        }
    if launches[0] != 4 * (calls + 200):
        raise RuntimeError(f"expected {4 * (calls + 200)} launches, counted {launches[0]}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="causal", help="stdlib variant (default causal)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    result = measure(args.variant, args.tokens, args.calls)
    print(" ".join(f"{name} {us:.1f}" for name, us in result.items()))


if __name__ == "__main__":
    main()
