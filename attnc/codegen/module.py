"""Emit the source of a JIT module: the functor plus a kernel template instantiation."""

from __future__ import annotations

from attnc.codegen.functor import emit_functor, functor_traits, struct_name
from attnc.codegen.instances import DTYPES, HEAD_DIMS
from attnc.codegen.names import comment_text
from attnc.codegen.templates import render_template
from attnc.compiler import ir
from attnc.compiler.analysed import analysed


def render_module(
    template: str, variant: ir.VariantIR, dtype: str, head_dim: int, **extra: object
) -> str:
    """Text of the .cu file made from ``template`` for ``variant`` (optimised IR); ``extra``
    goes to the template."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    functor = emit_functor(analysed(variant), header=False)
    return render_template(
        template,
        variant_name=comment_text(variant.name),
        dtype=dtype,
        head_dim=head_dim,
        functor=functor,
        struct_name=struct_name(variant),
        ctype=DTYPES[dtype],
        **extra,
    )


def render_prefill_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the prefill module of ``variant`` (optimised IR)."""
    return render_module("prefill_module.cu.j2", variant, dtype, head_dim)


def render_prefill_sm90_module(variant: ir.VariantIR, dtype: str, head_dim: int) -> str:
    """Text of the .cu file of the Hopper (sm_90a) prefill module of ``variant``: the same
    functor and C ABI as ``render_prefill_module``, built only for sm_90a."""
    return render_module(
        "prefill_sm90_module.cu.j2", variant, dtype, head_dim, wide_elsewhere=False
    )


def sm90_has_three_consumer_kernel(variant: ir.VariantIR, head_dim: int) -> bool:
    """Whether the Hopper module of ``variant`` at ``head_dim`` holds a three-consumer kernel
    next to the two-consumer one: the light class of Sm90Consumers
    (attnc/kernels/include/attnc/sm90/prefill_sm90_config.cuh), whose rule this repeats so
    that the module can be built from two sources (it decides what is built, so it cannot ask
    a built module). A wrong "yes" fails the build (a static_assert in both sources); the
    codegen tier checks every stdlib variant's answer against its kernels, and
    tests/codegen/test_selection_mirrors.py this rule against Sm90Consumers itself."""
    traits = functor_traits(analysed(variant))
    return (
        head_dim <= 128
        and traits.use_softmax
        and (not traits.mask_reads_tokens or head_dim == 128)
        and (not traits.bias_step or head_dim == 128)  # kGemmBiasVariant
    )


def render_prefill_sm90_sources(
    variant: ir.VariantIR, dtype: str, head_dim: int
) -> tuple[str, ...]:
    """The sources of the Hopper prefill module of ``variant``, built into one library: the
    main one, and for a module with a three-consumer kernel a second holding that kernel
    (compiled in parallel: the first call of a new variant waits on the longer one)."""
    if not sm90_has_three_consumer_kernel(variant, head_dim):
        return (render_prefill_sm90_module(variant, dtype, head_dim),)
    return (
        render_module("prefill_sm90_module.cu.j2", variant, dtype, head_dim, wide_elsewhere=True),
        render_module("prefill_sm90_wide.cu.j2", variant, dtype, head_dim),
    )
