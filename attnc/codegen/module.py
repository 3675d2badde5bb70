"""Emit the source of a JIT module: the functor plus the kernel template instantiation."""

from __future__ import annotations

from attnc.codegen.functor import emit_functor, struct_name
from attnc.codegen.templates import render_template
from attnc.compiler import ir
from attnc.compiler.pipeline import optimise

DTYPES = {"bfloat16": "__nv_bfloat16", "float16": "half"}
HEAD_DIMS = (64, 128, 256)


def render_prefill_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the prefill module of ``variant`` (optimised IR)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    # The IR given is already optimised; analyses are recomputed (they are cheap and pure).
    compiled = optimise(variant)
    functor = emit_functor(compiled).replace("#pragma once\n", "")
    return render_template(
        "prefill_module.cu.j2",
        variant_name=variant.name,
        dtype=dtype,
        head_dim=head_dim,
        functor=functor,
        struct_name=struct_name(variant),
        ctype=DTYPES[dtype],
    )
