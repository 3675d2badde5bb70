"""Compile a variant, check it against the eager reference, and run the CUDA kernel if a GPU
is present.

    python examples/run_variant.py examples/gemma_local.attn --variant gemma_local
"""

from __future__ import annotations

import argparse

import torch

import attnc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="a .attn file or stdlib:NAME")
    parser.add_argument("--variant", help="the variant to use when the file has several")
    parser.add_argument("--q-len", type=int, default=64)
    parser.add_argument("--kv-len", type=int, default=256)
    args = parser.parse_args()

    variant = attnc.load(args.spec, args.variant)
    print(variant, "-", variant.doc)
    heads_qo, heads_kv, head_dim = 8, 2, 64
    params = {}
    for p in variant.params:
        if p.kind == "tensor":
            params[p.name] = torch.rand(heads_qo) * 0.1
        elif p.default is None:
            params[p.name] = 1.0 if p.dtype == "f32" else 64

    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in params.items()}
    q = torch.randn(args.q_len, heads_qo, head_dim, device=device)
    k = torch.randn(args.kv_len, heads_kv, head_dim, device=device)
    v = torch.randn(args.kv_len, heads_kv, head_dim, device=device)

    ref, lse = variant.reference(q.double(), k.double(), v.double(), return_lse=True, **params)
    print(f"reference: output {tuple(ref.shape)}, LSE range [{lse.min():.3f}, {lse.max():.3f}]")
    same = variant.reference(q, k, v, **params)
    print(f"float32 reference vs float64: {((same.double() - ref).norm() / ref.norm()):.2e}")
    if device == "cuda":
        out = variant.prefill(q.bfloat16(), k.bfloat16(), v.bfloat16(), **params)
        err = (out.double() - ref).norm() / ref.norm()
        print(f"bf16 kernel vs float64 reference: {err:.2e}")


if __name__ == "__main__":
    main()
