"""Host time of ``BatchDecodeWrapper.plan()`` at batch 256 x KV 4096 (page 16, 32 query / 8 KV
heads, head_dim 128), median (and mean) of many calls, with a per-stage breakdown, for the two
ways the suites measured it:

- ``host``: as ``benchmarks/host.py``'s plan row: ``kv_indptr`` and ``kv_last_page_len`` on the
  host, page ids on the GPU (a random page order), median of the calls.
- ``quick``: as ``benchmarks/decode_quick.py``: every table on the host (``torch.randperm`` page
  ids), mean of the calls; and the same with a sliding window of 1024 given to ``plan()``, and
  with a per-request window tensor of 1024s (``per_request_window``: the sizes it is checked
  against, kv_indptr among them, are checked with it; the checked path on every plan).
- ``decode_zipf lengths``: BATCH requests of decode_quick's zipf lengths (256 to 32768 tokens,
  unequal costs: the LPT heap and the split candidates do real work), host ids.

    python -m benchmarks.decode_plan_time            # on the CPU: planner built, copies faked
    python -m benchmarks.decode_plan_time --cuda     # a real CUDA workspace (GPU machine)

On the CPU (no GPU), the wrapper is assembled around a host "workspace" as
``tests/codegen/test_decode_plan_step.py`` does: the planner library is built with nvcc and its
CUDA calls are switched to host memcpys (so the copies that a GPU does by DMA cost host time
here; the ``copies`` figure below says how much), and device-resident page ids are emulated by
host ids the planner is told live on the device.

Stages (microseconds per call, median): ``page status`` (the device page-id word read),
``mask ranges`` (the plan-time params' mask), ``checked path`` (the Python checks of a new or
non-plain call, without what it calls below), ``planner`` (the C++ checks, plan and copies),
``python`` (the rest of ``plan()``).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

import attnc
from attnc.runtime.abi import AttncDecodeArgs
from attnc.runtime.checks.page_status import PageStatus
from attnc.runtime.planning import decode_plan, decode_plan_library
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK
from attnc.runtime.planning.workspace import make_layout
from attnc.runtime.wrappers import decode_launch, decode_planning
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

HQ, HKV, D, PAGE = 32, 8, 128, 16
BATCH, KV_LEN = 256, 4096
WINDOW = {"window": 1024}
WS_BYTES = 256 << 20


ZIPF = [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(BATCH)]


def page_table(
    lengths: list[int] | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kv_indptr, kv_indices, kv_last_page_len) on the host: requests of ``lengths`` tokens
    (default BATCH of KV_LEN), pages in a random order."""
    lengths = [KV_LEN] * BATCH if lengths is None else lengths
    pages = torch.tensor([-(-n // PAGE) for n in lengths])
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(int(indptr[-1]), generator=gen).to(torch.int32)
    last = torch.tensor([(n - 1) % PAGE + 1 for n in lengths], dtype=torch.int32)
    return indptr, ids, last


class _CpuModule:
    """The decode module's stand-in on the CPU: its params struct only."""

    def __init__(self, variant: object) -> None:
        from attnc.runtime import abi

        self.params_type = abi.params_struct(variant.ir.params)  # type: ignore[attr-defined]


def cpu_wrapper(name: str) -> BatchDecodeWrapper:
    """``BatchDecodeWrapper.__init__`` on the CPU (host memory for the workspace and the pinned
    buffer; 132 SMs, two CTAs per SM, 16-row tiles of 64 KV tokens, as the H200 plans)."""
    variant = attnc.load(f"stdlib:{name}")
    w = object.__new__(BatchDecodeWrapper)
    w.variant, w.kv_layout, w.use_cuda_graph = variant, "NHD", False
    w._ws = torch.zeros(WS_BYTES, dtype=torch.uint8)
    w._device, w._device_index, w._num_sms = torch.device("cuda:0"), 0, 132
    w.layout = make_layout(WS_BYTES, BATCH, max(16384, 64 * BATCH), 8 * 132, None)
    w._pinned = torch.zeros(w.layout.work_bytes(w.layout.max_items), dtype=torch.uint8)
    w._pinned_np = w._pinned.numpy()
    w._native, w._fast, w._shape, w._module = None, None, None, None
    w._modules = {(torch.bfloat16, D, HQ // HKV): (_CpuModule(variant), 16, 64, 2)}
    w._args = AttncDecodeArgs()
    w._args_ref = ctypes.byref(w._args)
    w._max_page, w._batch, w._q_rows = -1, 0, 0
    w._last_kv = w._applied = None
    w._packer = decode_launch.ParamsPacker(variant.params)
    w._all_defaults = all(d.kind != "tensor" and d.default is not None for d in variant.params)
    w._calls, w._planned_mask = {}, NO_PLANNED_MASK
    w._page_status = PageStatus(torch.device("cpu"))
    w.last_schedule, w.handle = None, 0
    return w


@contextmanager
def cpu_planner() -> Iterator[None]:
    """The planner's CUDA calls as host memcpys, pinned buffers as plain host memory, and
    nothing else (``_device_ids_plan`` emulates device-resident page ids)."""
    saved = (decode_planning._GET_RAW_STREAM, decode_planning._pinned_empty)
    decode_plan_library.fake_cuda(1)
    decode_planning._GET_RAW_STREAM = lambda index: 0
    decode_planning._pinned_empty = lambda n: torch.zeros(n, dtype=torch.uint8)
    try:
        yield
    finally:
        decode_plan_library.fake_cuda(0)
        decode_planning._GET_RAW_STREAM, decode_planning._pinned_empty = saved


class StageClock:
    """Nanoseconds spent in named methods during one call (outermost calls only)."""

    def __init__(self) -> None:
        self.spent: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: object, attr: str, stage: str) -> None:
        """Time ``owner.attr`` as ``stage`` (nested time is subtracted from enclosing stages)."""
        real = getattr(owner, attr)
        clock = self

        def timed(*args: object, **kwargs: object) -> object:
            t = time.perf_counter_ns()
            before = sum(clock.spent.values())
            try:
                return real(*args, **kwargs)
            finally:
                inner = sum(clock.spent.values()) - before
                clock.spent[stage] = clock.spent.get(stage, 0) + time.perf_counter_ns() - t - inner

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, real))

    def undo(self) -> None:
        """Put the real methods back."""
        for fn in reversed(self._undo):
            fn()
        self._undo.clear()


def timed_calls(fn: Callable[[], object], n: int) -> list[float]:
    """Microseconds of ``n`` calls of ``fn`` (after five warm-ups)."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1e3)
    return out


def breakdown(fn: Callable[[], object], n: int) -> dict[str, float]:
    """Median microseconds per stage of ``plan()`` (see the module docstring)."""
    clock = StageClock()
    clock.wrap(decode_planning.PageStatus, "raise_if_set", "page status")
    clock.wrap(decode_planning.DecodePlanning, "_mask_ranges", "mask ranges")
    clock.wrap(decode_planning.DecodePlanning, "_plan_checked", "checked path")
    clock.wrap(decode_plan.DecodePlanner, "step", "planner")
    clock.wrap(decode_plan.DecodePlanner, "check", "planner")
    clock.wrap(decode_plan.DecodePlanner, "step_checked", "planner")
    per_stage: dict[str, list[float]] = {}
    try:
        fn()
        for _ in range(n):
            clock.spent.clear()
            t = time.perf_counter_ns()
            fn()
            total = time.perf_counter_ns() - t
            clock.spent["python"] = total - sum(clock.spent.values())
            for stage, ns in clock.spent.items():
                per_stage.setdefault(stage, []).append(ns / 1e3)
    finally:
        clock.undo()
    return {k: statistics.median(v) for k, v in per_stage.items()}


def copies_us(n: int) -> float:
    """Median microseconds the faked copies of one plan take on the CPU (work region of the
    plan and BATCH x KV_LEN / PAGE page ids, host memcpys)."""
    src = np.ones((BATCH * KV_LEN // PAGE) * 4 + 81920, np.uint8)
    dst = np.ones_like(src)
    return statistics.median(timed_calls(lambda: np.copyto(dst, src), n))


def report(setups: list[tuple[str, Callable[[], object]]], n: int, rounds: int = 10) -> None:
    """Per setup: median and mean over ``n`` calls, timed in ``rounds`` interleaved rounds (so
    a slow spell of the machine hits every setup alike), then the stage breakdown."""
    times: dict[str, list[float]] = {label: [] for label, _ in setups}
    for _ in range(rounds):
        for label, fn in setups:
            times[label] += timed_calls(fn, max(1, n // rounds))
    for label, fn in setups:
        med, mean = statistics.median(times[label]), statistics.fmean(times[label])
        print(f"{label:44s} median {med:7.1f} us   mean {mean:7.1f} us   (n={len(times[label])})")
        stages = breakdown(fn, max(50, n // 4))
        print("    " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))


def run_cpu(n: int) -> None:
    """Both setups on the CPU."""
    indptr, ids, last = page_table()
    with cpu_planner():
        host, quick, window = (
            cpu_wrapper("vanilla"),
            cpu_wrapper("vanilla"),
            cpu_wrapper("sliding_window"),
        )
        zipf, zipf_table = cpu_wrapper("vanilla"), page_table(ZIPF)
        per_request = cpu_wrapper("per_request_window")
        per_request._device = torch.device("cpu")  # where its window tensor lives here
        windows = {"window": torch.full((BATCH,), 1024, dtype=torch.int32)}
        _plan(host, indptr, ids, last)  # the checked path once, with host ids
        report(
            [
                ("host.py setup (device ids emulated)", _device_ids_plan(host, indptr, ids, last)),
                ("decode_quick setup (host ids)", lambda: _plan(quick, indptr, ids, last)),
                (
                    "decode_quick setup, window 1024 param",
                    lambda: _plan(window, indptr, ids, last, params=WINDOW),
                ),
                (
                    "decode_quick setup, window[batch] tensor",
                    lambda: _plan(per_request, indptr, ids, last, params=windows),
                ),
                ("decode_zipf lengths (host ids)", lambda: _plan(zipf, *zipf_table)),
            ],
            n,
        )
        print(f"(faked copies alone: {copies_us(n):.1f} us of each host-ids plan above)")


def _device_ids_plan(
    w: BatchDecodeWrapper, indptr: torch.Tensor, ids: torch.Tensor, last: torch.Tensor
) -> Callable[[], None]:
    """plan() of ``w`` with host ``ids`` handed to the planner as device-resident ones (no
    host scan, a "device to device" copy, the page-status word pending afterwards, as with
    GPU ids): ``w``'s own ``_native_step`` says "on the device"."""
    real = w._native_step

    def native_step(q_len, kv_indptr, kv_indices, kv_last_page_len, on_device, *checked):  # type: ignore[no-untyped-def]
        return real(q_len, kv_indptr, kv_indices, kv_last_page_len, True, *checked)

    w._native_step = native_step  # type: ignore[method-assign]
    return lambda: _plan(w, indptr, ids, last)


def _plan(w: BatchDecodeWrapper, indptr, ids, last, params=None) -> None:
    w.plan(indptr, ids, last, HQ, HKV, D, PAGE, dtype=torch.bfloat16, params=params)


def run_cuda(n: int) -> None:
    """Both setups with a real CUDA workspace."""
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")
    indptr, ids, last = page_table()
    dev_ids = ids.cuda()
    host = BatchDecodeWrapper(attnc.load("stdlib:vanilla"), ws)
    quick = BatchDecodeWrapper(attnc.load("stdlib:vanilla"), ws)
    graph = BatchDecodeWrapper(attnc.load("stdlib:vanilla"), ws, use_cuda_graph=True)
    window = BatchDecodeWrapper(attnc.load("stdlib:sliding_window"), ws)
    per_request = BatchDecodeWrapper(attnc.load("stdlib:per_request_window"), ws)
    windows = {"window": torch.full((BATCH,), 1024, dtype=torch.int32, device="cuda")}
    zipf, zipf_table = BatchDecodeWrapper(attnc.load("stdlib:vanilla"), ws), page_table(ZIPF)
    report(
        [
            ("host.py setup (device ids)", lambda: _plan(host, indptr, dev_ids, last)),
            ("decode_quick setup (host ids)", lambda: _plan(quick, indptr, ids, last)),
            ("decode_quick setup, use_cuda_graph", lambda: _plan(graph, indptr, ids, last)),
            (
                "decode_quick setup, window 1024 param",
                lambda: _plan(window, indptr, ids, last, params=WINDOW),
            ),
            (
                "decode_quick setup, window[batch] tensor",
                lambda: _plan(per_request, indptr, ids, last, params=windows),
            ),
            ("decode_zipf lengths (host ids)", lambda: _plan(zipf, *zipf_table)),
        ],
        n,
    )
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    """Print the plan() host times (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cuda", action="store_true", help="a real CUDA workspace")
    parser.add_argument("-n", type=int, default=300, help="calls per figure")
    args = parser.parse_args(argv)
    print(f"plan() batch {BATCH} x KV {KV_LEN}, page {PAGE}, {HQ}/{HKV} heads, d={D}")
    (run_cuda if args.cuda else run_cpu)(args.n)


if __name__ == "__main__":
    main()
