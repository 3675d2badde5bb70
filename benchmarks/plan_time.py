"""Host time of ``BatchPrefillWrapper.plan()`` for issue 13's document workload: one ragged
request of 8K tokens packed from 8 documents (seeded cuts), 32 query / 8 KV heads,
head_dim 128, with the ``doc_causal`` tile map waited for (``doc``: ``wait_for_tile_map=True``)
and without it (``nodoc``: the same
variant planned without its tensor, tiles keep the causal range), median of many calls with a
per-stage breakdown. Also ``paged``: the same 8K request in pages of 16 without the map, and
``doc_alternating``: calls alternate between that batch and another (8000 tokens, 7
documents, another tensor), so nothing of the previous call's checks can be reused; and with
``--cuda``, ``doc_nowait``: the doc row on a wrapper with ``wait_for_tile_map=False`` (the
default: the plan's copy, the classifier and the item step queued in one call, nothing
waited for).

    python -m benchmarks.plan_time            # on the CPU: a stand-in module (Hopper tile of
                                              # 48 query tokens, 132 CTAs), the map built once
                                              # by a host builder and cached
    python -m benchmarks.plan_time --cuda     # the real module and map classifier on a CUDA
                                              # workspace (GPU machine)
    python -m benchmarks.plan_time --cuda --kernels   # also the GPU work of the doc_nowait row's
                                              # plan() (the copy, the classifier, the item
                                              # step), mean us per plan

Stages (microseconds per call, median): ``checks`` (the index tensors, in the host planner),
``params`` (the plan-time params and the mask's closed-form ranges), ``map`` (build and the
one synchronisation: on the GPU the classifier, the head lists up and the map down; for
``doc_nowait`` the one queued call that also copies the lists), ``planner`` (the C++ plan:
tile ranges from the closed form and the map, chunks, order, packed lists), ``copy`` (the
lists to the workspace; none for ``doc_nowait``), ``python`` (the rest of ``plan()``:
module choice, shapes, launch metadata).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning import prefill_planner
from attnc.runtime.wrappers import prefill, prefill_batch, prefill_ctas
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

HQ, HKV, D = 32, 8, 128
TOKENS, DOCS, PAGE = 8192, 8, 16
WS_BYTES = 128 << 20
STAGES = ("checks", "params", "map", "planner", "copy")


def doc_ids(total: int = TOKENS, docs: int = DOCS, seed: int = 0) -> torch.Tensor:
    """int32 [total]: the document of each token (docs of seeded random lengths)."""
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(int(c) + 1 for c in torch.randperm(total - 1, generator=gen)[: docs - 1])
    bounds = [0, *cuts, total]
    spans = enumerate(zip(bounds, bounds[1:], strict=False))
    return torch.cat([torch.full((b - a,), i, dtype=torch.int32) for i, (a, b) in spans])


def doc_map(doc: np.ndarray, q_len: int, kv_len: int, tile: int, block: int) -> np.ndarray:
    """The doc_causal tile map of one request (EMPTY 0 / FULL 1 / PARTIAL 2), by brute force."""
    q_pos = np.arange(q_len) + kv_len - q_len
    rows = []
    for q0 in range(0, q_len, tile):
        qp = q_pos[q0 : q0 + tile]
        vis = (np.arange(kv_len)[None, :] <= qp[:, None]) & (doc[None, :] == doc[qp][:, None])
        for k0 in range(0, kv_len, block):
            box = vis[:, k0 : k0 + block]
            rows.append(0 if not box.any() else (1 if box.all() else 2))
    return np.array(rows, dtype=np.uint8)


class Stages:
    """Per-call seconds of the wrapped stages of the current call."""

    def __init__(self) -> None:
        self.now: dict[str, float] = dict.fromkeys(STAGES, 0.0)

    def wrap(self, owner: object, name: str, stage: str) -> None:
        """Time ``owner.name`` (a function or method) into ``stage``."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.now[stage] += time.perf_counter() - t0

        setattr(owner, name, timed)


@contextmanager
def stand_in(variant: object) -> Iterator[None]:
    """On the CPU: the module choice and the device CTAs of a Hopper module, 48-token tiles
    (three consumers, 192 packed rows at 32 / 8 heads)."""
    fields = {"module_id": "m", "ir": variant.ir, "params_type": abi.params_struct(variant.params)}
    module = type("StandIn", (), fields)()
    saved = prefill.choose_prefill_module, prefill_ctas.device_ctas
    prefill.choose_prefill_module = lambda *a, **k: PrefillChoice("sm90", module, 48)
    prefill_ctas.device_ctas = lambda *a, **k: 132
    try:
        yield
    finally:
        prefill.choose_prefill_module, prefill_ctas.device_ctas = saved


def measure(plan: Callable[[], None], stages: Stages, calls: int) -> dict[str, float]:
    """Median microseconds of ``plan()`` and of each stage over ``calls`` calls."""
    for _ in range(20):
        plan()
    total, per_stage = [], {s: [] for s in (*STAGES, "python")}
    for _ in range(calls):
        stages.now = dict.fromkeys(STAGES, 0.0)
        t0 = time.perf_counter()
        plan()
        total.append(time.perf_counter() - t0)
        for s in STAGES:
            per_stage[s].append(stages.now[s])
        per_stage["python"].append(total[-1] - sum(stages.now.values()))
    out = {"plan_us": 1e6 * statistics.median(total), "plan_min_us": 1e6 * min(total)}
    out.update({f"{s}_us": 1e6 * statistics.median(v) for s, v in per_stage.items()})
    return out


def instrument(stages: Stages) -> None:
    """Time the stages of ``plan()`` (module attributes the wrapper calls)."""
    stages.wrap(prefill_batch, "checked_batch", "checks")
    stages.wrap(BatchPrefillWrapper, "_plan_params", "params")
    stages.wrap(BatchPrefillWrapper, "_build_map", "map")
    stages.wrap(BatchPrefillWrapper, "_queue_map", "map")
    stages.wrap(prefill_planner.PrefillPlanner, "_run", "planner")
    stages.wrap(BatchPrefillWrapper, "_copy_to_workspace", "copy")


def run(cuda: bool, calls: int) -> dict[str, dict[str, float]]:
    """The three rows (nodoc, doc, paged)."""
    device = "cuda" if cuda else "cpu"
    variant = attnc.load("stdlib:doc_causal")
    doc = doc_ids().to(device)
    workspace = torch.empty(WS_BYTES, dtype=torch.uint8, device=device)
    w = BatchPrefillWrapper(variant, workspace, wait_for_tile_map=True)
    if not cuda:
        cached: dict[tuple[int, int], np.ndarray] = {}

        def builder(values, q_lens, kv_lens, tile, block):
            key = (tile, block)
            if key not in cached:
                cached[key] = doc_map(
                    values["doc"].numpy(), int(q_lens[0]), int(kv_lens[0]), tile, block
                )
            return cached[key]

        w._map_builder = builder
    qo = torch.tensor([0, TOKENS], dtype=torch.int32)
    kv = qo.clone()
    pages = -(-TOKENS // PAGE)
    paged_indptr = torch.tensor([0, pages], dtype=torch.int32)
    ids = torch.randperm(pages, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    last = torch.tensor([(TOKENS - 1) % PAGE + 1], dtype=torch.int32)
    other_qo = torch.tensor([0, 8000], dtype=torch.int32)
    other_doc = doc_ids(8000, DOCS - 1, seed=1).to(device)
    flip = [False]

    def alternating() -> None:
        flip[0] = not flip[0]
        if flip[0]:
            w.plan(other_qo, other_qo, HQ, HKV, D, params={"doc": other_doc})
        else:
            w.plan(qo, kv, HQ, HKV, D, params={"doc": doc})

    stages = Stages()
    instrument(stages)
    rows = {
        "nodoc": lambda: w.plan(qo, kv, HQ, HKV, D),
        "doc": lambda: w.plan(qo, kv, HQ, HKV, D, params={"doc": doc}),
        "paged": lambda: w.plan(
            qo, paged_indptr, HQ, HKV, D, kv_indices=ids, kv_last_page_len=last, page_size=PAGE
        ),
        "doc_alternating": alternating,
    }
    if cuda:  # a CPU workspace builds the map first whatever the wrapper says
        nowait = BatchPrefillWrapper(
            variant,
            torch.empty(WS_BYTES, dtype=torch.uint8, device=device),
            wait_for_tile_map=False,
        )
        rows["doc_nowait"] = lambda: nowait.plan(qo, kv, HQ, HKV, D, params={"doc": doc})
    return {name: measure(fn, stages, calls) for name, fn in rows.items()}


def kernel_us(calls: int = 50) -> dict[str, float]:
    """Mean GPU microseconds per doc-row ``plan()`` of each kernel it launches (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    w = BatchPrefillWrapper(
        attnc.load("stdlib:doc_causal"),
        torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda"),
        wait_for_tile_map=False,
    )
    qo = torch.tensor([0, TOKENS], dtype=torch.int32)
    doc = doc_ids().to("cuda")
    for _ in range(5):
        w.plan(qo, qo, HQ, HKV, D, params={"doc": doc})
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            w.plan(qo, qo, HQ, HKV, D, params={"doc": doc})
        torch.cuda.synchronize()
    found: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            found[e.key[:60]] = e.self_device_time_total / calls
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", action="store_true", help="plan on a CUDA workspace (real module)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--kernels", action="store_true", help="with --cuda: GPU kernels per plan")
    args = ap.parse_args()
    if args.cuda:
        results = run(True, args.calls)
    else:
        with stand_in(attnc.load("stdlib:doc_causal")):
            results = run(False, args.calls)
    cols = ("plan_us", "plan_min_us", *(f"{s}_us" for s in (*STAGES, "python")))
    print("| row | " + " | ".join(c.removesuffix("_us") for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |")
    if args.cuda and args.kernels:
        for name, us in kernel_us().items():
            print(f"kernel {name}: {us:.1f} us per plan")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": "cuda" if args.cuda else "cpu", "rows": results}, f, indent=2)


if __name__ == "__main__":
    main()
