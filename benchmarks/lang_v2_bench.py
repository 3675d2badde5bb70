"""Language-v2 rows on one GPU (issue 13's performance table), side by side in one process.

- **documents**: 8K tokens packed from 8 documents of seeded random lengths, causal inside each
  (``stdlib:doc_causal`` with its tile map), against the same template's causal 8K and against
  FlexAttention with a ``create_block_mask`` document mask; also ``plan()`` time with the map,
  and both again for a wrapper that does not wait for the map (``doc_nowait_*``:
  ``wait_for_tile_map=False``).
- **per-request windows**: a batch of 4 x 4096 with ``window`` given per request
  (``stdlib:per_request_window``) against the scalar ``stdlib:sliding_window``, same width.
- **sinks**: ``stdlib:gpt_oss_local`` (window 128 + a sink per head) against
  ``stdlib:sliding_window`` at window 128, prefill 8K and decode 64 x 4096 (page size 16);
  with ``--flashinfer`` also FlashInfer's attention-sink wrapper on the same shapes.

bf16, 32/8 heads, d=128; TFLOP/s over visible pairs (decode: TB/s of KV read). Timing is the
suite's (``benchmarks.timing.bench_ms``: triton ``do_bench``, cold L2), each timing after
``--cooldown`` seconds of idle GPU (default 1, as the suite: the card lowers its clocks after
a busy stretch). Prints a markdown table and writes JSON (``--out``). Usage:
``python -m benchmarks.lang_v2_bench [--out FILE] [--backend auto|fa2|sm90] [--flashinfer]
[--cooldown SECONDS] [--rows documents,windows,sinks]``.
"""

from __future__ import annotations

import argparse
import json
import time

HQ, HKV, D = 32, 8, 128
_PAUSE_S = 1.0  # idle seconds before each timing (--cooldown)


def _bench_ms(fns, graph: bool = False) -> float:
    """The suite's median milliseconds of ``fns``, after ``_PAUSE_S`` of idle GPU."""
    from benchmarks.timing import bench_ms

    return bench_ms(fns, graph=graph, pause_s=_PAUSE_S)[0]


def _doc_lengths(total: int, docs: int, seed: int = 0) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(int(c) + 1 for c in torch.randperm(total - 1, generator=gen)[: docs - 1])
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _qkv(n: int, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    return (torch.randn(n, HQ, D, **kw), torch.randn(n, HKV, D, **kw),
            torch.randn(n, HKV, D, **kw))  # fmt: skip


def _workspace():
    import torch

    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def _prefill(
    name: str, lens: list[int], backend: str, params: dict, plan_params: dict, wait: bool = True
):
    """A planned BatchPrefillWrapper over ragged requests ``lens`` (q = kv); returns run()
    (``wait``: the wrapper's wait_for_tile_map)."""
    import torch

    import attnc
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

    n = sum(lens)
    q, k, v = _qkv(n)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    w = BatchPrefillWrapper(
        attnc.load(f"stdlib:{name}"), _workspace(), backend=backend, wait_for_tile_map=wait
    )
    w.plan(indptr, indptr, HQ, HKV, D, dtype=torch.bfloat16, params=plan_params)
    return w, (lambda: w.run(q, (k, v), **params)), indptr


def _tflops(pairs: float, ms: float) -> float:
    return 4.0 * pairs * D * HQ / (ms * 1e-3) / 1e12


def _causal_pairs(lens: list[int]) -> float:
    return float(sum(n * (n + 1) // 2 for n in lens))


def _window_pairs(lens: list[int], window: int) -> float:
    return float(sum(sum(min(i + 1, window) for i in range(n)) for n in lens))


def documents(backend: str, out: dict) -> None:
    """doc_causal vs causal (same template) vs FlexAttention's document block mask."""
    import torch

    lens = _doc_lengths(8192, 8)
    doc = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)]).cuda()
    for wait, tag in ((True, "doc"), (False, "doc_nowait")):  # nowait: wait_for_tile_map=False
        w, run_doc, indptr = _prefill(
            "doc_causal", [8192], backend, {"doc": doc}, {"doc": doc}, wait
        )
        times = []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            w.plan(indptr, indptr, HQ, HKV, D, dtype=torch.bfloat16, params={"doc": doc})
            times.append(time.perf_counter() - t0)
        out[f"{tag}_plan_us"] = sorted(times)[15] * 1e6
        run_doc()
        out[f"{tag}_tflops"] = _tflops(_causal_pairs(lens), _bench_ms([run_doc]))
        out[f"{tag}_backend"] = w.planned_backend
    _, run_causal, _ = _prefill("causal", [8192], backend, {}, {})
    out["causal_tflops"] = _tflops(_causal_pairs([8192]), _bench_ms([run_causal]))
    out["doc_lengths"] = lens
    try:
        out["flex_doc_tflops"] = _tflops(_causal_pairs(lens), _flex_documents_ms(doc))
    except Exception as exc:  # FlexAttention missing or failing: say why
        out["flex_doc_tflops"] = f"error: {type(exc).__name__}: {exc}"[:200]


def _flex_documents_ms(doc) -> float:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = doc.numel()
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in _qkv(n))
    docs = doc.to(torch.int64)

    def mask(b, h, qi, ki):
        return (ki <= qi) & (docs[ki] == docs[qi])

    block = create_block_mask(mask, None, None, n, n, device="cuda")
    flex = torch.compile(flex_attention)

    def call():
        return flex(q, k, v, block_mask=block, enable_gqa=True)

    call()
    return _bench_ms([call])


def windows(backend: str, out: dict) -> None:
    """per_request_window (a window per request) vs sliding_window (one scalar window)."""
    import torch

    lens, width = [4096] * 4, 1024
    win = torch.full((len(lens),), width, dtype=torch.int32).cuda()
    _, run_req, _ = _prefill("per_request_window", lens, backend, {"window": win},
                             {"window": win})  # fmt: skip
    _, run_scalar, _ = _prefill("sliding_window", lens, backend, {"window": width},
                                {"window": width})  # fmt: skip
    pairs = _window_pairs(lens, width)
    out["per_request_window_tflops"] = _tflops(pairs, _bench_ms([run_req]))
    out["scalar_window_tflops"] = _tflops(pairs, _bench_ms([run_scalar]))


def sinks(backend: str, out: dict) -> None:
    """gpt_oss_local (window 128 + sinks) vs sliding_window 128: prefill 8K and decode."""
    import torch

    sink = torch.randn(HQ, device="cuda", dtype=torch.float32)
    lens = [8192]
    _, run_sink, _ = _prefill("gpt_oss_local", lens, backend, {"sinks": sink},
                              {"window": 128})  # fmt: skip
    _, run_plain, _ = _prefill("sliding_window", lens, backend, {"window": 128},
                               {"window": 128})  # fmt: skip
    pairs = _window_pairs(lens, 128)
    out["sink_prefill_tflops"] = _tflops(pairs, _bench_ms([run_sink]))
    out["nosink_prefill_tflops"] = _tflops(pairs, _bench_ms([run_plain]))
    out["sink_decode_tbs"], out["nosink_decode_tbs"] = (
        _decode_tbs("gpt_oss_local", {"sinks": sink, "window": 4096}),
        _decode_tbs("sliding_window", {"window": 4096}),
    )


def flashinfer_sinks(backend: str, out: dict) -> None:
    """FlashInfer's attention-sink path (``BatchAttentionWithAttentionSinkWrapper``, paged, page
    16) on the sink rows' shapes: prefill 8K with window 128, decode 64 x 4096 (one query per
    request, the window past the KV), and the relative difference of its prefill output from
    attnc's gpt_oss_local on the same inputs (the sink is a logit in both)."""
    import flashinfer
    import torch

    sink = torch.randn(HQ, device="cuda", dtype=torch.float32)
    n, page = 8192, 16
    q, k, v = _qkv(n)
    cache = torch.stack([k, v], dim=1).view(n // page, page, 2, HKV, D).transpose(1, 2)
    cache = cache.contiguous()  # [pages, 2, page, H_kv, D], pages in order
    i32 = dict(dtype=torch.int32, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchAttentionWithAttentionSinkWrapper(ws, "NHD", window_left=127,
                                                          q_data_type=torch.bfloat16,
                                                          kv_data_type=torch.bfloat16)  # fmt: skip
    w.plan(torch.tensor([0, n], **i32), torch.tensor([0, n // page], **i32),
           torch.arange(n // page, **i32), torch.tensor([page], **i32), HQ, HKV, D, page,
           causal=True, window_left=127, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)  # fmt: skip
    scale = D**-0.5
    out["flashinfer_sink_prefill_tflops"] = _tflops(
        _window_pairs([n], 128), _bench_ms([lambda: w.run(q, cache, sink, scale)])
    )
    _, run_ours, _ = _prefill("gpt_oss_local", [n], backend, {"sinks": sink}, {"window": 128})
    theirs, ours = w.run(q, cache, sink, scale).double(), run_ours().double()
    out["flashinfer_sink_rel_diff"] = ((theirs - ours).norm() / ours.norm()).item()
    batch, kv = 64, 4096
    pages = kv // page
    dec_cache = torch.randn(batch * pages, 2, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    dq = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    w.plan(torch.arange(batch + 1, **i32), torch.arange(0, batch * pages + 1, pages, **i32),
           torch.randperm(batch * pages, dtype=torch.int32).cuda(),
           torch.full((batch,), page, **i32), HQ, HKV, D, page, causal=True,
           window_left=kv, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip
    ms = _bench_ms([lambda: w.run(dq, dec_cache, sink, scale)])
    out["flashinfer_sink_decode_tbs"] = 2.0 * batch * kv * HKV * D * 2 / (ms * 1e-3) / 1e12


def _decode_tbs(name: str, params: dict) -> float:
    """Batch 64 x KV 4096, page 16, one query per request: TB/s of K and V read."""
    import torch

    import attnc
    from attnc.runtime.wrappers.decode import BatchDecodeWrapper

    batch, kv, page = 64, 4096, 16
    pages = kv // page
    cache = torch.randn(batch * pages, 2, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    indptr = torch.arange(0, batch * pages + 1, pages, dtype=torch.int32)
    indices = torch.randperm(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), page, dtype=torch.int32)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    w = BatchDecodeWrapper(attnc.load(f"stdlib:{name}"), _workspace())
    scalars = {k: v for k, v in params.items() if not isinstance(v, torch.Tensor)}
    w.plan(indptr, indices, last, HQ, HKV, D, page, dtype=torch.bfloat16, params=scalars)

    def call():
        return w.run(q, cache, **params)

    call()
    ms = _bench_ms([call])
    return 2.0 * batch * kv * HKV * D * 2 / (ms * 1e-3) / 1e12


ROW_GROUPS = {"documents": documents, "windows": windows, "sinks": sinks}


def main() -> None:
    """Run every row (each one guarded: a failing row reports its error), print and save."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--flashinfer",
        action="store_true",
        help="also FlashInfer's attention-sink path (its JIT build takes ~90 s)",
    )
    ap.add_argument("--cooldown", type=float, default=1.0, help="idle seconds before each timing")
    ap.add_argument(
        "--rows",
        default=",".join(ROW_GROUPS),
        help=f"comma-separated groups to run, of {', '.join(ROW_GROUPS)} (default: all)",
    )
    args = ap.parse_args()
    groups = [g for g in args.rows.split(",") if g]
    unknown = [g for g in groups if g not in ROW_GROUPS]
    if unknown or not groups:
        ap.error(f"--rows: {', '.join(unknown) or 'nothing'}: groups are {', '.join(ROW_GROUPS)}")
    from benchmarks.timing import pause_error

    bad_pause = pause_error(args.cooldown)
    if bad_pause is not None:
        ap.error(bad_pause)
    global _PAUSE_S
    _PAUSE_S = args.cooldown
    out: dict[str, object] = {"backend": args.backend, "cooldown_s": args.cooldown}
    rows = [ROW_GROUPS[g] for g in groups] + ([flashinfer_sinks] if args.flashinfer else [])
    for row in rows:
        try:
            row(args.backend, out)
        except Exception as exc:  # report and go on with the next row
            out[f"{row.__name__}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(out, default=str), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
