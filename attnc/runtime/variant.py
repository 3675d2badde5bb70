"""The user-facing handle of one compiled variant: reference, kernels and generated code."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from attnc.compiler import ir as ir_nodes
from attnc.compiler.results import Compiled
from attnc.dsl.errors import Diagnostic
from attnc.runtime.checks.params import resolve_params
from attnc.runtime.reference import check_qkv, reference_attention


class Variant:
    """A compiled attention variant.

    ``reference`` runs the eager PyTorch reference (any float dtype, any device);
    ``prefill`` runs the generated CUDA kernel for one request; ``params`` lists the runtime
    params (name, kind, dtype, dims, default) in the order kernels expect them.
    """

    def __init__(self, compiled: Compiled, warnings: tuple[Diagnostic, ...] = ()) -> None:
        self.compiled = compiled
        self.warnings = warnings

    @property
    def ir(self) -> ir_nodes.VariantIR:
        """The optimised IR (what kernels and the reference are generated from)."""
        return self.compiled.variant

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def doc(self) -> str:
        return self.ir.doc

    @property
    def params(self) -> tuple[ir_nodes.ParamDecl, ...]:
        return self.ir.params

    def __repr__(self) -> str:
        params = ", ".join(p.name for p in self.params)
        return f"Variant({self.name!r}, params=[{params}])"

    @cached_property
    def cuda_source(self) -> str:
        """The generated functor header."""
        from attnc.codegen.functor import emit_functor  # Jinja: loaded on first use

        return emit_functor(self.compiled)

    @cached_property
    def _reference_module(self):
        from attnc.codegen.torch_ref import load_reference

        return load_reference(self.ir)

    @property
    def reference_source(self) -> str:
        """The generated PyTorch reference (Python source)."""
        return self._reference_module.__source__

    def resolve(self, q: torch.Tensor, k: torch.Tensor, params: dict[str, Any]) -> dict[str, Any]:
        """Validated runtime params for inputs shaped like ``q`` and ``k``."""
        return resolve_params(
            self.params,
            params,
            variant_name=self.name,
            num_qo_heads=q.shape[1],
            num_kv_heads=k.shape[1],
            head_dim=q.shape[2],
            device=q.device,
        )

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        sm_scale: float | None = None,
        return_lse: bool = False,
        **params: Any,
    ):
        """Eager attention of one request: q ``[q_len, H_qo, D]``, k/v ``[kv_len, H_kv, D]``.

        Returns the output ``[q_len, H_qo, D]`` in q's dtype and, with ``return_lse``, the
        natural-log LSE ``[q_len, H_qo]`` (float32 for 16-bit inputs).
        """
        check_qkv(q, k, v)
        resolved = self.resolve(q, k, params)
        return reference_attention(
            self._reference_module,
            q,
            k,
            v,
            sm_scale=sm_scale,
            return_lse=return_lse,
            params=resolved,
        )

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        sm_scale: float | None = None,
        return_lse: bool = False,
        **params: Any,
    ):
        """The CUDA kernel on one request (same shapes and results as ``reference``)."""
        from attnc.runtime.wrappers.prefill import single_prefill

        return single_prefill(
            self, q, k, v, sm_scale=sm_scale, return_lse=return_lse, params=params
        )


def load(spec: str, variant: str | None = None) -> Variant:
    """Compile a `.attn` file path, ``stdlib:NAME`` or source text and return one variant.

    ``variant`` picks one when the file defines several. Errors in the source raise
    :class:`attnc.AttnError` (``str()`` shows ``file:line:col``, the line and a caret).
    """
    from attnc.compiler.sources import resolve_source
    from attnc.runtime.build.variant_cache import compile_cached

    text, file = resolve_source(spec)
    compiled, warnings = compile_cached(text, file)
    if not compiled:
        raise ValueError(f"{file} defines no variant")
    if variant is None:
        if len(compiled) > 1:
            names = ", ".join(c.variant.name for c in compiled)
            raise ValueError(f"{file} defines several variants ({names}): pass variant=NAME")
        return Variant(compiled[0], warnings)
    for c in compiled:
        if c.variant.name == variant:
            return Variant(c, warnings)
    names = ", ".join(c.variant.name for c in compiled)
    raise ValueError(f"{file} has no variant '{variant}'; it defines: {names}")
