"""A minimal continuous-batching server loop on a random-weight Llama-style model, with attnc
(and FlashInfer, when it imports) as the attention backend.

    python examples/serve.py                         # 256 requests, prompts 128-4096, 256 new tokens
    python examples/serve.py --backend attnc --requests 64 --new-tokens 128
    python examples/serve.py --quick                 # a smoke run of both backends (32 requests)
    python examples/serve.py --tiny                  # seconds; checks attnc against torch attention

Each step: admit arriving requests while their pages fit (a free-page allocator over a paged
KV cache, pages reserved for prompt + new tokens), run one decode token for every request past
its prompt (a CUDA graph per batch-size bucket, the decode wrapper planned once per step and
run by every layer inside the graph), then up to ``--chunk-tokens`` prompt tokens of the
requests still in prefill (chunked prefill, planned once per step). Prints generated tokens/s
and per-step latency percentiles, one JSON line per backend (``{"backend": ..., ...}``), and
plots the step latencies when matplotlib is installed. ``--budget`` seconds cap the whole
run: after its set-up (graphs, JIT builds, warm-up), each backend's loop gets an equal share
of what is left; a loop that reaches its share stops at the end of a step and its JSON line
says ``"truncated": true``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from serve_backends import Heads, PageTable, make_backend
from serve_model import ModelShape, PagedKVCache, TinyLlama


@dataclass
class Request:
    """One generation request and its progress."""

    rid: int
    prompt: torch.Tensor  # [prompt_len] int64, on the host
    new_tokens: int
    arrival: int  # the step at which it arrives
    pages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    length: int = 0  # tokens in the KV cache
    out: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # recorded with --tiny

    def __post_init__(self) -> None:
        # A request that asks for no token would be dropped part-way through its prefill
        # (it counts as finished as soon as it is admitted), and an empty prompt has no
        # token to start from.
        n = self.new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"request {self.rid}: new_tokens must be an integer >= 1, got {n!r}")
        if self.prompt.dim() != 1 or self.prompt.numel() < 1:
            raise ValueError(
                f"request {self.rid}: prompt must be a 1-D tensor of at least one token, "
                f"got shape {tuple(self.prompt.shape)}"
            )

    @property
    def in_prefill(self) -> bool:
        return self.length < self.prompt.numel()


def make_requests(count: int, min_prompt: int, max_prompt: int, new_tokens: int, vocab: int,
                  per_step: int, seed: int) -> list[Request]:  # fmt: skip
    """Seeded prompts of uniform random length; ``per_step`` requests arrive each step."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_prompt, max_prompt + 1, (count,), generator=g).tolist()
    return [
        Request(i, torch.randint(0, vocab, (n,), generator=g), new_tokens, i // per_step)
        for i, n in enumerate(lengths)
    ]


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error for sizes the engine cannot run with (a page size or an arrival rate of 0
    divided by zero) and for requests longer than the model's positions."""
    for name in ("requests", "new_tokens", "min_prompt", "max_prompt", "arrivals_per_step",
                 "max_batch", "chunk_tokens", "page_size", "layers"):  # fmt: skip
        value = getattr(args, name, None)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.min_prompt > args.max_prompt:
        parser.error(f"--min-prompt {args.min_prompt} is above --max-prompt {args.max_prompt}")
    positions = ModelShape().max_positions
    if args.max_prompt + args.new_tokens > positions:
        parser.error(
            f"--max-prompt {args.max_prompt} + --new-tokens {args.new_tokens} exceed the "
            f"model's {positions} positions"
        )


def buckets_up_to(max_batch: int) -> list[int]:
    """Decode batch sizes that get a CUDA graph: powers of two, then ``max_batch``."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


class Engine:
    """The serving loop over one model, one paged cache and one attention backend."""

    def __init__(self, model: TinyLlama, cache: PagedKVCache, backend, *, max_batch: int,
                 chunk_tokens: int, record: bool = False):  # fmt: skip
        for name, value in (("max_batch", max_batch), ("chunk_tokens", chunk_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.model, self.cache, self.backend = model, cache, backend
        self.max_batch, self.chunk_tokens, self.record = max_batch, chunk_tokens, record
        self.device = cache.layers[0].device
        self.buckets = buckets_up_to(max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.truncated = False  # the last run() stopped at its deadline

    # ---- page tables -------------------------------------------------------------------
    def _table(self, reqs: list[Request], kv_lens: list[int], q_lens: list[int],
               pad_to: int = 0) -> PageTable:  # fmt: skip
        ps = self.cache.page_size
        counts = [self.cache.pages_for(n) for n in kv_lens]
        parts = [r.pages[:c] for r, c in zip(reqs, counts, strict=True)]
        lasts = [n - ps * (c - 1) for n, c in zip(kv_lens, counts, strict=True)]
        pad = pad_to - len(reqs)  # padding requests: one token on the scratch page
        parts += [np.array([PagedKVCache.SCRATCH_PAGE], dtype=np.int32)] * pad
        counts, lasts, q_lens = counts + [1] * pad, lasts + [1] * pad, q_lens + [1] * pad
        return PageTable(
            _indptr(q_lens), _indptr(counts),
            torch.from_numpy(np.concatenate(parts).astype(np.int32)),
            torch.tensor(lasts, dtype=torch.int32),
        )  # fmt: skip

    def _slots(self, reqs_positions: list[tuple[Request, int]]) -> tuple[list[int], list[int]]:
        ps = self.cache.page_size
        pages = [int(r.pages[p // ps]) for r, p in reqs_positions]
        return pages, [p % ps for _, p in reqs_positions]

    # ---- decode ------------------------------------------------------------------------
    def _decode_inputs(self, reqs: list[Request], bucket: int) -> dict[str, torch.Tensor]:
        pad = bucket - len(reqs)
        pages, offsets = self._slots([(r, r.length) for r in reqs])
        return {
            "tokens": torch.tensor([r.out[-1] for r in reqs] + [0] * pad),
            "positions": torch.tensor([r.length for r in reqs] + [0] * pad),
            "pages": torch.tensor(pages + [PagedKVCache.SCRATCH_PAGE] * pad),
            "offsets": torch.tensor(offsets + [0] * pad),
        }

    def _forward_decode(self, bucket: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        def attend(layer, q, kv):
            return self.backend.decode(bucket, layer, q, kv)

        return self.model.forward(inputs["tokens"], inputs["positions"], inputs["pages"],
                                  inputs["offsets"], self.cache, attend)  # fmt: skip

    def capture(self) -> None:
        """One CUDA graph per bucket (largest first, sharing a memory pool)."""
        if not self.backend.graphs:
            return
        pool = None
        for bucket in reversed(self.buckets):
            static = {k: v.to(self.device) for k, v in self._decode_inputs([], bucket).items()}
            self.backend.plan_decode(bucket, self._table([], [], [], pad_to=bucket))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward_decode(bucket, static)  # warm-up (and JIT builds) outside capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static["logits"] = self._forward_decode(bucket, static)
            pool = graph.pool()
            self.graphs[bucket] = (graph, static)

    def decode_step(self, reqs: list[Request]) -> torch.Tensor:
        """One token for each request: logits ``[len(reqs), vocab]``."""
        bucket = next(b for b in self.buckets if b >= len(reqs))
        kv_lens = [r.length + 1 for r in reqs]
        table = self._table(reqs, kv_lens, [1] * len(reqs), pad_to=bucket)
        inputs = self._decode_inputs(reqs, bucket)
        self.backend.plan_decode(bucket, table)
        if bucket in self.graphs:
            graph, static = self.graphs[bucket]
            for key, value in inputs.items():
                static[key].copy_(value, non_blocking=True)
            graph.replay()
            logits = static["logits"][: len(reqs)]
        else:
            inputs = {k: v.to(self.device) for k, v in inputs.items()}
            logits = self._forward_decode(bucket, inputs)[: len(reqs)]
        for r in reqs:
            r.length += 1
        return logits

    # ---- prefill -----------------------------------------------------------------------
    def prefill_step(self, chunks: list[tuple[Request, int]]) -> tuple[list[Request], torch.Tensor]:
        """Run ``(request, n)`` prompt chunks; the requests whose prompt ends here and their
        next-token logits."""
        reqs, ps = [r for r, _ in chunks], self.cache.page_size
        spans = [np.arange(r.length, r.length + n) for r, n in chunks]
        positions = np.concatenate(spans)
        pages = np.concatenate(
            [r.pages[span // ps] for (r, _), span in zip(chunks, spans, strict=True)]
        )
        tokens = torch.cat([r.prompt[r.length : r.length + n] for r, n in chunks])
        kv_lens = [r.length + n for r, n in chunks]
        self.backend.plan_prefill(self._table(reqs, kv_lens, [n for _, n in chunks]))
        ends = np.cumsum([n for _, n in chunks]) - 1
        done = [i for i, (r, n) in enumerate(chunks) if r.length + n == r.prompt.numel()]
        dev = self.device
        logits = self.model.forward(
            tokens.to(dev), torch.from_numpy(positions).to(dev),
            torch.from_numpy(pages.astype(np.int64)).to(dev),
            torch.from_numpy(positions % ps).to(dev), self.cache,
            self.backend.prefill, torch.tensor(ends[done], device=dev, dtype=torch.long),
        )  # fmt: skip
        for r, n in chunks:
            r.length += n
        return [reqs[i] for i in done], logits

    # ---- the loop ----------------------------------------------------------------------
    def check_request(self, r: Request) -> None:
        """ValueError unless the model can serve ``r``: token ids in ``[0, vocab)`` (-1 read
        the last row of the embedding), and prompt + new tokens within the rotary table
        (past it the model's gather failed on the device)."""
        shape = self.model.shape
        bad = (r.prompt < 0) | (r.prompt >= shape.vocab)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"request {r.rid}: prompt[{i}] = {int(r.prompt[i])} is not a token id in "
                f"[0, {shape.vocab})"
            )
        total = r.prompt.numel() + r.new_tokens
        if total > shape.max_positions:
            raise ValueError(
                f"request {r.rid}: {r.prompt.numel()} prompt + {r.new_tokens} new tokens exceed "
                f"the model's {shape.max_positions} positions"
            )

    def run(self, requests: list[Request], forced: dict[int, list[int]] | None = None,
            deadline: float | None = None):  # fmt: skip
        """Serve every request (until ``deadline``, a ``time.perf_counter()`` value, passes:
        then ``truncated`` is set); per-step latencies (s) and whether each step had prefill."""
        for r in requests:
            self.check_request(r)
        waiting, running = deque(sorted(requests, key=lambda r: r.arrival)), []
        latencies, had_prefill, step = [], [], 0
        self.truncated = False
        while waiting or running:
            if deadline is not None and time.perf_counter() >= deadline:
                self.truncated = True
                break
            while waiting and waiting[0].arrival <= step and len(running) < self.max_batch:
                need = self.cache.pages_for(waiting[0].prompt.numel() + waiting[0].new_tokens)
                if need > self.cache.free_pages:
                    break
                r = waiting.popleft()
                r.pages = np.array(self.cache.allocate(need), dtype=np.int32)
                running.append(r)
            if not running:
                if waiting[0].arrival <= step:
                    raise ValueError(
                        f"request {waiting[0].rid} needs more pages than the cache has"
                    )
                step = waiting[0].arrival
                continue
            start = time.perf_counter()
            decoding = [r for r in running if not r.in_prefill]
            sampled: list[tuple[list[Request], torch.Tensor]] = []
            if decoding:
                sampled.append((decoding, self.decode_step(decoding)))
            chunks, budget = [], self.chunk_tokens
            for r in (r for r in running if r.in_prefill):
                n = min(r.prompt.numel() - r.length, budget)
                if n <= 0:
                    break
                chunks.append((r, n))
                budget -= n
            if chunks:
                sampled.append(self.prefill_step(chunks))
            for reqs, logits in sampled:
                self._sample(reqs, logits, forced)
            latencies.append(time.perf_counter() - start)  # _sample synchronised
            had_prefill.append(bool(chunks))
            for r in [r for r in running if len(r.out) >= r.new_tokens]:
                running.remove(r)
                self.cache.release(r.pages.tolist())
            step += 1
        return np.array(latencies), np.array(had_prefill)

    def _sample(self, reqs: list[Request], logits: torch.Tensor, forced) -> None:
        best = logits.argmax(dim=-1).tolist()
        for i, r in enumerate(reqs):
            r.out.append(forced[r.rid][len(r.out)] if forced else best[i])
            if self.record:
                r.logits.append(logits[i].cpu())


def _indptr(counts: list[int]) -> torch.Tensor:
    out = torch.zeros(len(counts) + 1, dtype=torch.int32)
    if counts:
        out[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    return out


def serve(args, backend_name: str, model: TinyLlama, record: bool = False, forced=None,
          budget_end: float | None = None, sharing: int = 1):  # fmt: skip
    """Run the loop on fresh requests and a fresh cache; (requests, latencies, the JSON
    summary). With ``budget_end`` the loop gets, after set-up, a ``1 / sharing`` share of the
    time left until then."""
    s = model.shape
    requests = make_requests(args.requests, args.min_prompt, args.max_prompt, args.new_tokens,
                             s.vocab, args.arrivals_per_step, args.seed)  # fmt: skip
    # Warm-up requests build the prefill kernels: short prompts, and chunks as long as the run's.
    longest = min(args.max_prompt, args.chunk_tokens)
    warm = make_requests(2, 16, 48, 2, s.vocab, 2, args.seed + 1)
    warm += make_requests(2, max(longest // 2, 1), longest, 2, s.vocab, 2, args.seed + 2)
    pages = 1 + max(
        sum(-(-(r.prompt.numel() + r.new_tokens) // args.page_size) for r in batch)
        for batch in (requests, warm)
    )
    cache = PagedKVCache(s, pages, args.page_size, model.cos.device, torch.bfloat16)
    heads = Heads(s.heads, s.kv_heads, s.head_dim, args.page_size, pages)
    backend = make_backend(backend_name, heads, model.cos.device)
    engine = Engine(model, cache, backend, max_batch=args.max_batch,
                    chunk_tokens=args.chunk_tokens, record=record)  # fmt: skip
    t = time.perf_counter()
    engine.capture()
    engine.run(warm)
    torch.cuda.synchronize()
    setup = time.perf_counter() - t
    print(f"[{backend_name}] set-up (graphs, JIT, warm-up): {setup:.1f} s")
    t = time.perf_counter()
    deadline = None if budget_end is None else t + (budget_end - t) / sharing
    latencies, had_prefill = engine.run(requests, forced, deadline)
    wall = time.perf_counter() - t
    summary = report(backend_name, requests, latencies, had_prefill, wall)
    summary.update(setup_s=round(setup, 2), truncated=engine.truncated)
    print(json.dumps(summary))
    return requests, latencies, summary


def report(name: str, requests: list[Request], lat: np.ndarray, had_prefill: np.ndarray,
           wall: float) -> dict:  # fmt: skip
    """Print throughput and step-latency percentiles; the same numbers as a dict."""
    generated = sum(len(r.out) for r in requests)
    prompt = sum(min(r.length, r.prompt.numel()) for r in requests)  # prompt tokens prefilled
    wall = max(wall, 1e-9)
    ms = lat * 1e3 if len(lat) else np.zeros(1)
    decode_steps = ~np.asarray(had_prefill, dtype=bool)
    decode_only = ms[decode_steps] if decode_steps.any() else ms
    summary = {
        "backend": name, "requests": len(requests),
        "finished": sum(len(r.out) >= r.new_tokens for r in requests),
        "prompt_tokens": prompt, "generated_tokens": generated, "wall_s": round(wall, 3),
        "generated_tokens_per_s": round(generated / wall, 1),
        "tokens_per_s": round((prompt + generated) / wall, 1), "steps": len(lat),
        "step_p50_ms": round(float(np.percentile(ms, 50)), 3),
        "step_p99_ms": round(float(np.percentile(ms, 99)), 3),
        "decode_step_p50_ms": round(float(np.percentile(decode_only, 50)), 3),
        "decode_step_p99_ms": round(float(np.percentile(decode_only, 99)), 3),
    }  # fmt: skip
    print(
        f"[{name}] {len(requests)} requests, {prompt} prompt + {generated} generated tokens in "
        f"{wall:.2f} s: {generated / wall:.0f} generated tokens/s, "
        f"{(prompt + generated) / wall:.0f} tokens/s in all; {len(lat)} steps, "
        f"step p50 {np.percentile(ms, 50):.2f} ms p99 {np.percentile(ms, 99):.2f} ms; "
        f"decode-only steps p50 {np.percentile(decode_only, 50):.2f} ms "
        f"p99 {np.percentile(decode_only, 99):.2f} ms"
    )
    return summary


def plot(results: dict[str, np.ndarray], path: str) -> None:
    """Step latency per step, one line per backend (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, lat in results.items():
        ax.plot(lat * 1e3, label=name, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("step latency (ms)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def tiny_check(args, model: TinyLlama) -> bool:
    """attnc's run against the same loop with float32 torch attention fed attnc's tokens.

    Passes when the logits of the two runs agree within 5% of the largest logit at every
    sampled position (a wrong mask, page or position gives differences of the order of the
    logits themselves). Reports how many attnc tokens are the torch run's best token; the
    others are near-ties, within twice the largest logit difference."""
    ours, _, _ = serve(args, "attnc", model, record=True)
    forced = {r.rid: r.out for r in ours}
    ref, _, _ = serve(args, "torch", model, record=True, forced=forced)
    diff = max((a - b).abs().max().item() for r, q in zip(ours, ref, strict=True)
               for a, b in zip(r.logits, q.logits, strict=True))  # fmt: skip
    scale = max(b.abs().max().item() for q in ref for b in q.logits)
    exact, worst = 0, 0.0
    for r, q in zip(ours, ref, strict=True):
        for tok, b in zip(r.out, q.logits, strict=True):
            exact += int(b.argmax()) == tok
            worst = max(worst, (b.max() - b[tok]).item())
    total = sum(len(r.out) for r in ours)
    ok = diff <= 0.05 * scale
    print(f"tiny check: {exact}/{total} tokens equal to the torch run's best, largest logit "
          f"difference {diff:.4f} (logits up to {scale:.2f}), worst margin {worst:.4f}: "
          f"{'ok' if ok else 'FAILED'}")  # fmt: skip
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["attnc", "flashinfer", "both"], default="both")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--min-prompt", type=int, default=128)
    p.add_argument("--max-prompt", type=int, default=4096)
    p.add_argument("--arrivals-per-step", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=256, help="largest decode batch (bucket)")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="prefill tokens per step")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="serve_steps.png")
    p.add_argument("--tiny", action="store_true", help="a quick run that checks attnc's tokens")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 32 requests, prompts 128-1024, 32 new tokens",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=480.0,
        help="seconds for the whole run (each backend an equal share of what is left)",
    )
    p.add_argument("--json", default=None, help="also write the JSON lines to this file")
    args = p.parse_args()  # fmt: skip
    check_args(p, args)
    if not torch.cuda.is_available():
        raise SystemExit("serve.py needs a CUDA GPU")
    if args.quick:
        args.requests, args.new_tokens, args.max_prompt, args.arrivals_per_step = 32, 32, 1024, 8
    if args.tiny:
        args.requests, args.new_tokens, args.min_prompt, args.max_prompt = 6, 8, 20, 300
        args.arrivals_per_step, args.max_batch, args.chunk_tokens = 2, 8, 256
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    model = TinyLlama(ModelShape(layers=args.layers), torch.device("cuda"), seed=args.seed)
    if args.tiny:
        raise SystemExit(0 if tiny_check(args, model) else 1)
    names = ["attnc", "flashinfer"] if args.backend == "both" else [args.backend]
    results, lines, end = {}, [], start + args.budget
    for i, name in enumerate(names):
        if name == "flashinfer":
            try:
                import flashinfer  # noqa: F401
            except ImportError:
                print("flashinfer does not import: no side-by-side run")
                continue
        now = time.perf_counter()
        if now >= end:
            print(f"[{name}] skipped: the --budget ran out")
            continue
        try:
            _, results[name], summary = serve(
                args, name, model, budget_end=end, sharing=len(names) - i
            )
            lines.append(summary)
        except Exception as exc:  # one backend failing still reports the other
            print(f"[{name}] failed: {type(exc).__name__}: {exc}")
        gc.collect()  # the run's cache, graphs and workspaces
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    plot(results, args.plot)


if __name__ == "__main__":
    main()
