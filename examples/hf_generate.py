"""transformers ``generate()`` with attnc against ``eager`` on a random-weight Gemma-2-shaped
model (soft-capped logits, alternating sliding-window and full layers).

    python examples/hf_generate.py                       # batch 8, 2K prompts, 256 new tokens
    python examples/hf_generate.py --impl attnc eager --window 1024 --layers 8

transformers refuses ``sdpa`` for Gemma-2 (it cannot soft-cap); the benchmark
``benchmarks/clients/generate_bench.py`` times it with the soft-cap switched off, next to
attnc and eager, with a time budget and a JSON report.

Prints seconds and generated tokens/s per implementation (after one warm-up call each) and
how many generated tokens agree with the first implementation listed.
"""

from __future__ import annotations

import argparse
import time

import torch


def build(args, impl: str):
    """The random-weight model (seeded, so every implementation gets the same weights)."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=args.vocab,
        sliding_window=args.window, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=8192,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.bfloat16)
    return model.cuda().eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", nargs="+", default=["attnc", "eager"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    args = p.parse_args()
    import attnc.integrations.transformers  # noqa: F401  (registers "attnc")

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g).cuda()
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=0,
                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)  # fmt: skip
    first = None
    for impl in args.impl:
        model = build(args, impl)
        with torch.no_grad():
            model.generate(ids[:, :64], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)[:, args.prompt :]
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        first = out if first is None else first
        same = (out == first).float().mean().item()
        print(f"{impl}: {seconds:.2f} s, {out.numel() / seconds:.0f} generated tokens/s, "
              f"{same:.1%} tokens as {args.impl[0]}")  # fmt: skip
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
