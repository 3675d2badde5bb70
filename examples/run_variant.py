"""Compile a variant, check it against the eager reference, and run the CUDA kernel if a GPU
is present.

    python examples/run_variant.py examples/gemma_local.attn --variant gemma_local
"""

from __future__ import annotations

import argparse

import torch

import attnc


def example_value(param, sizes: dict[str, int]):
    """A value for a param without a default: a tensor of its declared shape and dtype (a
    `[kv_len]` or `[q_len]` i32 tensor holds sorted ids in 0..3, as document ids would; other
    i32 tensors a width of 32), or a scalar of its type."""
    if param.kind != "tensor":
        return {"f32": 1.0, "i32": 64}.get(param.dtype, True)
    shape = [d if isinstance(d, int) else sizes[d] for d in param.dims]
    if param.dtype == "f32":
        return torch.rand(shape) * 0.1
    if param.dims and param.dims[0] in ("kv_len", "q_len"):
        return torch.randint(0, 4, shape, dtype=torch.int32).sort(dim=0).values
    return torch.full(shape, 32, dtype=torch.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="a .attn file or stdlib:NAME")
    parser.add_argument("--variant", help="the variant to use when the file has several")
    parser.add_argument("--q-len", type=int, default=64)
    parser.add_argument("--kv-len", type=int, default=256)
    args = parser.parse_args()
    if args.q_len < 1 or args.kv_len < 1:
        parser.error("--q-len and --kv-len must be at least 1")
    try:
        variant = attnc.load(args.spec, args.variant)
    except (OSError, ValueError, attnc.AttnError) as err:
        parser.error(str(err))
    print(variant, "-", variant.doc)
    heads_qo, heads_kv, head_dim = 8, 2, 64
    sizes = {
        "num_qo_heads": heads_qo, "num_kv_heads": heads_kv, "head_dim": head_dim,
        "q_len": args.q_len, "kv_len": args.kv_len, "batch_size": 1,
    }  # fmt: skip
    params = {p.name: example_value(p, sizes) for p in variant.params if p.default is None}

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
