"""Emit the source of a decode JIT module (the functor plus the decode template instantiation)
and of the standalone merge_state module."""

from __future__ import annotations

from attnc.codegen.module import render_module
from attnc.codegen.templates import render_template
from attnc.compiler import ir


def render_decode_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the decode module of ``variant`` (optimised IR)."""
    return render_module("decode_module.cu.j2", variant, dtype, head_dim)


def render_merge_state_module() -> str:
    """Text of the .cu file of the standalone merge_state module (no variant: one text)."""
    return render_template("merge_state_module.cu.j2")
