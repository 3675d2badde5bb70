"""The host suite: CPU cost of plan() and run(), and decode step latency eager vs CUDA graph.

Rows (unit microseconds, lower is better), attnc's BatchDecodeWrapper against FlashInfer's
BatchDecodeWithPagedKVCacheWrapper (tensor-core and CUDA-core decode), causal variant,
bf16, 32 query / 8 KV heads, head_dim 128, page 16 in random page order:

- ``plan()``, batch 256 x KV 4096: wall time of one call (``time.perf_counter``), median
  of many; indptr and last-page lengths on the host, page ids on the GPU.
- ``run()`` host time, eager: wall time of launching N calls without synchronising,
  divided by N, while the GPU is kept busy (``torch.cuda._sleep``) so launches only queue.
- step latency, batch 1 and 64 x KV 4096, eager and CUDA graph: wall time of one call (or
  one graph replay) plus ``torch.cuda.synchronize()``, median. Outputs are cross-checked
  against FlashInfer before timing, as in the other suites.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from benchmarks.measure import REL_TOL, rel_err
from benchmarks.outcome import Outcome, from_exception, short_reason
from benchmarks.results import Results
from benchmarks.system import workspace
from benchmarks.workloads import VARIANTS, DecodeCase

UNIT = "us"
SYSTEMS = ("attnc", "flashinfer_tc", "flashinfer_cc")
PLAN_BATCH = 256
KV_LEN = 4096


def median_us(fn: Callable[[], object], n: int) -> float:
    """Median wall time of ``fn()`` in microseconds over ``n`` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def launch_us(fn: Callable[[], object], calls: int = 100, reps: int = 11) -> float:
    """Host microseconds per call: N unsynchronised calls behind a busy GPU, median of reps."""
    import torch

    fn()
    torch.cuda.synchronize()
    sleep = getattr(torch.cuda, "_sleep", None)
    per_call = []
    for _ in range(reps):
        if sleep is not None:
            sleep(20_000_000)  # ~10 ms of GPU time: the launches below only queue
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t) / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6


def latency_us(fn: Callable[[], object], n: int = 200) -> float:
    """Median wall microseconds of ``fn()`` followed by ``torch.cuda.synchronize()``."""
    import torch

    def step():
        fn()
        torch.cuda.synchronize()

    return median_us(step, n)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured once in a CUDA graph; returns the replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def _case(batch: int) -> DecodeCase:
    return DecodeCase(VARIANTS["causal"], (KV_LEN,) * batch, label=f"batch {batch} x {KV_LEN}")


def _attnc_wrapper(case: DecodeCase, data, graph: bool):
    import torch

    import attnc
    from benchmarks.attnc_systems import load_variant

    wrapper = attnc.BatchDecodeWrapper(
        load_variant(case.variant.stdlib), workspace(), kv_layout="NHD", use_cuda_graph=graph
    )

    def plan():
        wrapper.plan(
            data.kv_indptr,
            data.kv_indices,
            data.kv_last_page_len,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            case.page_size,
            dtype=torch.bfloat16,
        )

    plan()
    return plan, lambda: wrapper.run(data.q, data.cache, **data.params)


def _flashinfer_wrapper(case: DecodeCase, data, tensor_cores: bool):
    import torch

    from benchmarks.flashinfer_anchor import flashinfer, variant_kwargs

    fi = flashinfer()
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_tensor_cores=tensor_cores
    )
    kwargs = variant_kwargs(case.variant)

    def plan():
        wrapper.plan(
            data.kv_indptr,
            data.kv_indices,
            data.kv_last_page_len,
            case.num_qo_heads,
            case.num_kv_heads,
            case.head_dim,
            case.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            **kwargs,
        )

    plan()
    return plan, lambda: wrapper.run(data.q, data.cache)


def make(name: str, case: DecodeCase, data, graph: bool = False):
    """(plan, run) callables of one system, planned once."""
    if name == "attnc":
        return _attnc_wrapper(case, data, graph)
    return _flashinfer_wrapper(case, data, name == "flashinfer_tc")


def _host_indptr(data) -> None:
    """plan() inputs as a serving loop has them: indptr and last-page lengths on the host."""
    data.kv_indptr = data.kv_indptr.cpu()
    data.kv_last_page_len = data.kv_last_page_len.cpu()


def _each(systems, fn: Callable[[str], float], log: Callable) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for name in systems:
        try:
            out[name] = Outcome("ok", value=fn(name))
        except Exception as exc:
            out[name] = from_exception(exc)
        log(f"  {name}: {out[name].status} {out[name].value} {out[name].note}")
    return out


def _plan_row(systems, args, results: Results, log: Callable) -> None:
    from benchmarks.inputs import make_paged

    case = _case(PLAN_BATCH)
    # plan() never reads the cache: the page table of the case over a tiny cache.
    data = make_paged(_small_cache_case(case), [1] * PLAN_BATCH, seed=0)
    _host_indptr(data)
    out = _each(systems, lambda n: median_us(make(n, case, data)[0], 200), log)
    results.add_row("host", f"plan(), {case.label}", UNIT, out, higher=False)


def _small_cache_case(case: DecodeCase) -> DecodeCase:
    """The page table of ``case`` over a tiny cache (page ids are never read by plan())."""
    return DecodeCase(case.variant, case.kv_lens, label=case.label, num_kv_heads=1, head_dim=8)


def _run_rows(systems, args, results: Results, log: Callable) -> None:
    """Eager run() host time (batch 64), then latency eager / graph at batch 64 and 1."""
    for batch in (64, 1):
        _batch_rows(systems, _case(batch), results, log)


def _batch_rows(systems, case: DecodeCase, results: Results, log: Callable) -> None:
    from benchmarks.inputs import make_paged

    batch = len(case.kv_lens)
    data = make_paged(case, [1] * batch, seed=0)
    _host_indptr(data)
    runs: dict[str, Callable] = {}
    outputs: dict = {}
    failed: dict[str, Outcome] = {}
    for name in systems:
        try:
            runs[name] = make(name, case, data)[1]
            outputs[name] = runs[name]()
        except Exception as exc:
            failed[name] = from_exception(exc)
    ref = next((n for n in systems if n in outputs and n != "attnc"), None)
    for name in list(runs):
        err = rel_err(outputs[name], outputs[ref]) if ref else 0.0
        if err > REL_TOL:
            failed[name] = Outcome("mismatch", note=f"rel err {err:.2e} vs {ref}", rel_err=err)
            del runs[name]
    del outputs

    def row(label: str, measure: Callable[[str], float]) -> None:
        log(f"[host] {label}")
        out = _each(list(runs), measure, log)
        out.update(failed)
        ordered = {n: out[n] for n in systems if n in out}
        results.add_row("host", label, UNIT, ordered, higher=False)

    if batch == 64:
        row(f"run() host time per call, eager, {case.label}", lambda n: launch_us(runs[n]))
    row(f"step latency, eager, {case.label}", lambda n: latency_us(runs[n]))

    def graph_latency(name: str) -> float:
        try:
            replay = graphed(make(name, case, data, graph=True)[1])
        except Exception as exc:
            raise RuntimeError(f"capture failed: {short_reason(exc, 60)}") from exc
        return latency_us(replay)

    row(f"step latency, CUDA graph, {case.label}", graph_latency)


def run_host(args, results: Results, log: Callable = print) -> None:
    """plan() and run() host cost, decode latency eager vs CUDA graph."""
    from benchmarks.suites import _free, out_of_time

    systems = [s for s in SYSTEMS if s not in args.skip]
    case = _case(PLAN_BATCH)
    if out_of_time(args, "host", case, results, log):
        return
    log(f"[host] plan(), {case.label}")
    _plan_row(systems, args, results, log)
    _free()
    if out_of_time(args, "host", _case(64), results, log):
        return
    _run_rows(systems, args, results, log)
    _free()
