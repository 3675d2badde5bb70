"""transformers ``generate()`` with the attnc attention backend against transformers' own
implementations, on a random-weight Gemma-2-shaped model (soft-capped logits, sliding-window
and full layers alternating).

    python benchmarks/clients/generate_bench.py                  # batch 8, 2K prompts, 256 new
    python benchmarks/clients/generate_bench.py --quick          # a small smoke run
    python benchmarks/clients/generate_bench.py --layers 8 --new-tokens 64 --budget 120

Owns: this benchmark. Implementations (``--impl``):

- ``attnc``: ``attn_implementation="attnc"`` (prefill kernels, then decode steps over the
  cache in place).
- ``eager``: transformers' eager attention, the only built-in one that soft-caps exactly.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``. It cannot soft-cap
  (Gemma-2 refuses it), so it runs the same weights with the soft-cap switched off on every
  layer: a faster-than-fair baseline, and its tokens differ.

Every implementation gets one warm-up ``generate()`` (full prompt, 4 new tokens: JIT builds
and allocator growth), then the timed one. A stopping criterion stamps each step, so the
report splits prefill (prompt to first token) from decode (tokens/s over the later steps).
``--budget`` seconds cap the whole run: after its warm-up, each implementation's timed run
gets an equal share of what is left and stops early when it reaches it (its row says
``truncated``).
Prints one line per implementation and writes JSON (``--out``) with tokens/s and the ratios
of attnc to each other implementation.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "clients-generate.json"


class StepClock:
    """A ``StoppingCriteria``: the time of every step, and a stop once ``deadline`` passes."""

    def __init__(self, deadline: float, device: torch.device):
        self.deadline, self.device = deadline, device
        self.stamps: list[float] = []
        self.truncated = False

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.stamps.append(now)
        stop = now >= self.deadline
        self.truncated |= stop
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """The random-weight Gemma-2-shaped model (seeded), built on ``device``."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, vocab_size=args.vocab,
        sliding_window=args.window, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=max(8192, args.prompt + args.new_tokens),
    )  # fmt: skip
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=dtype)
    return model.eval()


def register_sdpa_without_softcap() -> str:
    """``sdpa`` under a name of its own (without "sdpa" in it: Gemma-2 refuses those); the layers'
    soft-cap is switched off while it runs (see ``use_impl``)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("scaled_dot_product_nocap", sdpa_attention_forward)
    AttentionMaskInterface.register("scaled_dot_product_nocap", sdpa_mask)
    return "scaled_dot_product_nocap"


def use_impl(model, impl: str) -> None:
    """Switch ``model`` to ``impl``; ``sdpa`` runs without the attention soft-cap."""
    cap = None if impl == "sdpa" else model.config.attn_logit_softcapping
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = cap
    model.set_attn_implementation(register_sdpa_without_softcap() if impl == "sdpa" else impl)


def prompts(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded prompt ids and their attention mask (left-padded with ``--ragged``)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g)
    mask = torch.ones_like(ids)
    if args.ragged:
        lengths = torch.randint(args.prompt // 2, args.prompt + 1, (args.batch,), generator=g)
        for row, n in enumerate(lengths.tolist()):
            mask[row, : args.prompt - n] = 0
    return ids.to(device), mask.to(device)


def timed_generate(model, ids, mask, new_tokens: int, deadline: float) -> dict[str, Any]:
    """One greedy ``generate()``; seconds, steps and tokens/s (all, prefill, decode)."""
    from transformers import StoppingCriteriaList

    device = ids.device
    clock = StepClock(deadline, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, do_sample=False, pad_token_id=0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            stopping_criteria=StoppingCriteriaList([clock]),
        )  # fmt: skip
    seconds = time.perf_counter() - start
    steps = len(clock.stamps)
    batch = ids.shape[0]
    decode_s = clock.stamps[-1] - clock.stamps[0] if steps > 1 else float("nan")
    return {
        "seconds": seconds,
        "steps": steps,
        "truncated": clock.truncated and steps < new_tokens,
        "tokens_per_s": batch * steps / seconds,
        "prefill_s": clock.stamps[0] - start if steps else float("nan"),
        "decode_tokens_per_s": batch * (steps - 1) / decode_s if steps > 1 else float("nan"),
        "decode_step_ms": 1e3 * decode_s / (steps - 1) if steps > 1 else float("nan"),
        "tokens": out[:, ids.shape[1] :].cpu(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every implementation in turn on one model; the JSON report."""
    import transformers

    import attnc.integrations.transformers  # noqa: F401  (registers "attnc")

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    model = build_model(args, device, dtype)
    ids, mask = prompts(args, device)
    results: dict[str, dict[str, Any]] = {}
    for i, impl in enumerate(args.impl):
        left = deadline - time.perf_counter()
        if left <= 0:
            results[impl] = {"skipped": "the --budget ran out"}
            continue
        use_impl(model, impl)
        warm = timed_generate(model, ids, mask, 4, deadline)  # JIT builds land here
        share_end = time.perf_counter() + (deadline - time.perf_counter()) / (len(args.impl) - i)
        row = timed_generate(model, ids, mask, args.new_tokens, share_end)
        row["warmup_s"] = warm["seconds"]
        results[impl] = row
    first = next((r["tokens"] for r in results.values() if "tokens" in r), None)
    for row in results.values():
        if "tokens" in row and first is not None:
            n = min(row["tokens"].shape[1], first.shape[1])
            same = row["tokens"][:, :n] == first[:, :n]
            row["same_tokens_as_first"] = same.float().mean().item() if n else float("nan")
        row.pop("tokens", None)
    ratios = {}
    ours = results.get("attnc", {})
    for impl, row in results.items():
        if impl != "attnc" and "tokens_per_s" in row and "tokens_per_s" in ours:
            ratios[f"attnc/{impl}"] = ours["tokens_per_s"] / row["tokens_per_s"]
            ratios[f"attnc/{impl} decode"] = (
                ours["decode_tokens_per_s"] / row["decode_tokens_per_s"]
            )
    return {
        "benchmark": "transformers generate(), Gemma-2-shaped random weights",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "transformers": transformers.__version__,
        "results": results,
        "ratios": ratios,
        "wall_s": time.perf_counter() - t0,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (``--quick`` shrinks the model and the run)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", nargs="+", default=["attnc", "sdpa", "eager"],
                   choices=["attnc", "sdpa", "eager"])  # fmt: skip
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--hidden", type=int, default=2304)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--window", type=int, default=1024,
                   help="sliding window of the local layers (Gemma-2: 4096; 1024 so that it "
                        "binds at a 2K prompt)")  # fmt: skip
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--ragged", action="store_true", help="left-padded prompts of mixed length")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="4 layers, batch 4, 512 + 32 tokens")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.batch, args.prompt, args.new_tokens = 4, 4, 512, 32
        args.window = min(args.window, 256)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, print one line per implementation and the ratios, write the JSON."""
    args = parse_args(argv)
    report = run(args)
    for impl, row in report["results"].items():
        if "skipped" in row:
            print(f"{impl}: skipped ({row['skipped']})")
            continue
        print(f"{impl}: {row['tokens_per_s']:.0f} generated tokens/s ({row['steps']} steps in "
              f"{row['seconds']:.2f} s{', truncated by --budget' if row['truncated'] else ''}); "
              f"prefill {row['prefill_s']:.3f} s, decode {row['decode_tokens_per_s']:.0f} "
              f"tokens/s ({row['decode_step_ms']:.2f} ms/step); "
              f"{row['same_tokens_as_first']:.1%} tokens as {args.impl[0]}")  # fmt: skip
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio:.3f}x tokens/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"json: {args.out}")
    return report


if __name__ == "__main__":
    main()
