"""gpt-oss attention (examples/gpt_oss.attn): sliding-window-128 and full causal layers, both
with per-head sinks, checked against the fp64 reference and against the sink formula written
out as gpt-oss computes it (a sink column appended to the logits, dropped after the softmax);
on a GPU the CUDA kernel runs each layer too.

    python examples/gpt_oss.py
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

import attnc
from attnc.runtime.reference import request_reference

SPEC = str(Path(__file__).with_name("gpt_oss.attn"))
LAYERS = ["gpt_oss_sliding", "gpt_oss_full"] * 2  # gpt-oss alternates the two kinds
HEADS_QO, HEADS_KV, HEAD_DIM, TOKENS = 8, 2, 64, 300


def written_out(q, k, v, sinks, window: int | None) -> torch.Tensor:
    """softmax over [logits, sink] per row, the sink column dropped (float64)."""
    n = q.shape[0]
    group = HEADS_QO // HEADS_KV
    kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, kx) / math.sqrt(HEAD_DIM)
    pos = torch.arange(n)
    keep = pos.view(1, n) <= pos.view(n, 1)
    if window is not None:
        keep &= pos.view(n, 1) - pos.view(1, n) < window
    s = s.masked_fill(~keep, -math.inf)
    column = sinks.double().view(-1, 1, 1).expand(-1, n, 1)
    w = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", w, vx)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for layer, name in enumerate(LAYERS):
        variant = attnc.load(SPEC, name)
        q = torch.randn(TOKENS, HEADS_QO, HEAD_DIM, generator=g, dtype=torch.float64)
        k = torch.randn(TOKENS, HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
        v = torch.randn(TOKENS, HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
        sinks = torch.randn(HEADS_QO, generator=g) * 2.0
        ref = request_reference(variant, q, k, v, sinks=sinks)
        window = 128 if name == "gpt_oss_sliding" else None
        err = (ref - written_out(q, k, v, sinks, window)).abs().max().item()
        print(f"layer {layer} {name}: reference vs written-out sink softmax: {err:.2e}")
        assert err < 1e-12
        if device == "cuda":
            dt = torch.bfloat16
            out = variant.prefill(
                q.to(device, dt), k.to(device, dt), v.to(device, dt), sinks=sinks.to(device)
            )
            gpu_err = (out.double().cpu() - ref).abs().max().item()
            print(f"layer {layer} {name}: CUDA bf16 vs reference: {gpu_err:.2e}")
            assert gpu_err < 3e-2
    if device == "cpu":
        print("no CUDA device: the kernels were not run")


if __name__ == "__main__":
    main()
