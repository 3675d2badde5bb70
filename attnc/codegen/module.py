"""Emit the source of a JIT module: the functor plus a kernel template instantiation."""

from __future__ import annotations

from attnc.codegen.functor import emit_functor, struct_name
from attnc.codegen.names import comment_text
from attnc.codegen.templates import render_template
from attnc.compiler import ir
from attnc.compiler.analysed import analysed

DTYPES = {"bfloat16": "__nv_bfloat16", "float16": "half"}
HEAD_DIMS = (64, 128, 256)


def render_module(template: str, variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file made from ``template`` for ``variant`` (optimised IR)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    functor = emit_functor(analysed(variant)).replace("#pragma once\n", "")
    return render_template(
        template,
        variant_name=comment_text(variant.name),
        dtype=dtype,
        head_dim=head_dim,
        functor=functor,
        struct_name=struct_name(variant),
        ctype=DTYPES[dtype],
    )


def render_prefill_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the prefill module of ``variant`` (optimised IR)."""
    return render_module("prefill_module.cu.j2", variant, dtype, head_dim)


def render_prefill_sm90_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the Hopper (sm_90a) prefill module of ``variant``: the same
    functor and C ABI as ``render_prefill_module``, built only for sm_90a."""
    return render_module("prefill_sm90_module.cu.j2", variant, dtype, head_dim)
