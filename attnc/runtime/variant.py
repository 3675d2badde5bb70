"""Owns: the user-facing handle of one compiled variant (reference, kernels, generated code)
and ``load``, which turns a path, ``stdlib:NAME`` or source text into one."""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from attnc.compiler import ir as ir_nodes
from attnc.runtime.tracing import compiling

if TYPE_CHECKING:  # the code generators load on first use
    from attnc.codegen.derived_range import CheckedValue
from attnc.compiler.results import Compiled
from attnc.dsl.errors import Diagnostic, printable
from attnc.runtime.checks.params import resolve_params, token_sizes
from attnc.runtime.checks.tensors import check_flag, shown_value
from attnc.runtime.reference import check_qkv, reference_attention
from attnc.runtime.value_keys import value_key
from attnc.runtime.variant_memo import VariantMemo


class Variant:
    """A compiled attention variant.

    ``reference`` runs the eager PyTorch reference (any float dtype, any device);
    ``prefill`` runs the generated CUDA kernel for one request; ``params`` lists the runtime
    params (name, kind, dtype, dims, default) in the order kernels expect them.
    """

    def __init__(self, compiled: Compiled, warnings: tuple[Diagnostic, ...] = ()) -> None:
        self.compiled = compiled
        self.warnings = warnings
        ir = compiled.variant  # frozen: the names below never go stale
        # The text the IR's locations quote, held while the variant lives: the locations
        # refer to it weakly, so that IR kept in caches keeps no text alive.
        self._source_text = getattr(ir.file, "source", None)
        self.name: str = ir.name
        """The variant's name as the source declares it."""
        self.doc: str = ir.doc
        """The variant's ``doc`` string (empty when the source gives none)."""
        self.params: tuple[ir_nodes.ParamDecl, ...] = ir.params
        """The runtime params, in the order kernels expect them."""
        # How custom ops (which take no Python objects) name this variant.
        self.handle = next(_HANDLES)
        self.memo = VariantMemo()
        """What the runtime works out once for this variant (internal: the planners'
        memo, see ``attnc.runtime.variant_memo``)."""
        # (scalar values, sm_scale, heads) whose derived values were found in range.
        self._derived_checked: OrderedDict[tuple[object, ...], None] = OrderedDict()  # LRU
        _VARIANTS[self.handle] = self

    def __reduce__(self) -> tuple[type[Variant], tuple[Compiled, tuple[Diagnostic, ...]]]:
        """Copies and pickles are made anew from the compiled variant: a handle of their
        own (a copied handle named the original, or in another process whichever variant
        holds that number there, to the custom ops), no plans, no memo, no loaded
        modules."""
        return type(self), (self.compiled, self.warnings)

    @property
    def ir(self) -> ir_nodes.VariantIR:
        """The optimised IR (what kernels and the reference are generated from)."""
        return self.compiled.variant

    def __repr__(self) -> str:
        params = ", ".join(p.name for p in self.params)
        return f"Variant({self.name!r}, params=[{params}])"

    @cached_property
    def cuda_source(self) -> str:
        """The generated functor header."""
        from attnc.codegen.functor import emit_functor  # Jinja: loaded on first use

        return emit_functor(self.compiled)

    @cached_property
    def reference_module(self):
        """The generated reference's module (``reference_source``; internal: the batch
        reference runs it too), in ``sys.modules`` while this variant lives: dynamo
        imports the module of a function it inlines by name (``torch.compile`` of
        ``reference`` failed with ModuleNotFoundError for a reference calling its helpers)."""
        from attnc.codegen.torch_ref import load_reference

        module = load_reference(self.ir)
        sys.modules[module.__name__] = module
        weakref.finalize(self, sys.modules.pop, module.__name__, None)
        return module

    @property
    def reference_source(self) -> str:
        """The generated PyTorch reference (Python source)."""
        return self.reference_module.__source__

    def resolve_request(
        self, q: torch.Tensor, k: torch.Tensor, params: Mapping[str, object]
    ) -> dict[str, Any]:
        """Validated runtime params for inputs shaped like ``q`` and ``k`` (one request: a
        ``kv_len`` tensor has k.shape[0] entries, a ``q_len`` one q.shape[0], a
        ``batch_size`` one 1). Internal: ``q`` and ``k`` are checked by the caller."""
        heads = (q.shape[1], k.shape[1], q.shape[2])
        return self.resolve_for(params, heads, q.device, token_sizes(q.shape[0], k.shape[0], 1))

    def resolve_for(
        self,
        params: Mapping[str, object],
        heads: tuple[int, int, int],
        device: torch.device | str | None,
        batch_sizes: Mapping[str, int] | None,
    ) -> dict[str, Any]:
        """Validated runtime params (``resolve_params``) for ``heads`` = (num_qo_heads,
        num_kv_heads, head_dim) and the batch's token counts ``batch_sizes``
        (``token_sizes``); tensors must be on ``device``. Internal: the wrappers call it with
        checked heads, sizes and device."""
        num_qo_heads, num_kv_heads, head_dim = heads
        return resolve_params(
            self.params,
            params,
            variant_name=self.name,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            device=device,
            batch_sizes=batch_sizes,
        )

    def check_derived_values(
        self, values: Mapping[str, object], sm_scale: float, heads: tuple[int, int, int]
    ) -> None:
        """Refuse scalar param values (resolved; a missing one takes its default) whose
        float32 values the kernels derive once per request, with ``sm_scale``, overflow or
        fall below the normal range (``attnc.codegen.derived_range``): a ``ValueError``
        naming the variant, the values and the derived expression. Not while
        ``torch.compile`` traces (the custom ops' bodies check at run time)."""
        if compiling() or not self._derived_exprs:
            return
        scalars = tuple(
            (d.name, values[d.name] if d.name in values else d.default)
            for d in self.params
            if d.kind != "tensor"
        )
        key = (tuple(value_key(v) for _, v in scalars), value_key(sm_scale), heads)
        if key in self._derived_checked:
            self._derived_checked.move_to_end(key)
            return
        from attnc.codegen.derived_range import derived_value_problem

        problem = derived_value_problem(self._derived_exprs, dict(scalars), sm_scale, heads)
        if problem is not None:
            raise ValueError(f"variant '{self.name}': {printable(problem)}")
        self._derived_checked[key] = None
        if len(self._derived_checked) > _DERIVED_CHECKS_KEPT:
            self._derived_checked.popitem(last=False)  # the least recently checked

    @cached_property
    def _derived_exprs(self) -> tuple[CheckedValue, ...]:
        from attnc.codegen.derived_range import checked_value_exprs

        return checked_value_exprs(self.compiled)

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        /,
        *,
        sm_scale: float | None = None,
        return_lse: bool = False,
        **params: Any,
    ):
        """Eager attention of one request: q ``[q_len, H_qo, D]``, k/v ``[kv_len, H_kv, D]``,
        positional-only (a param may be named q, k or v); params by keyword.

        Returns the output ``[q_len, H_qo, D]`` in q's dtype and, with ``return_lse``, the
        natural-log LSE ``[q_len, H_qo]`` (float32 for 16-bit inputs).
        """
        check_qkv(q, k, v)
        check_flag("return_lse", return_lse)
        resolved = self.resolve_request(q, k, params)
        return reference_attention(
            self.reference_module,
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
        /,
        *,
        sm_scale: float | None = None,
        return_lse: bool = False,
        backend: str | None = None,
        **params: Any,
    ):
        """The CUDA kernel on one request (same shapes and results as ``reference``).

        ``backend``: ``"auto"`` (default: the Hopper template on sm_90 where it serves the
        request, else FA2), ``"fa2"`` or ``"sm90"``. Under ``torch.compile`` it traces to one
        ``attnc::single_prefill`` custom op (with the process default backend)."""
        check_flag("return_lse", return_lse)
        return _single_prefill()(
            self, q, k, v, sm_scale=sm_scale, return_lse=return_lse, params=params,
            backend=backend,
        )  # fmt: skip


_HANDLES = itertools.count(1)
# How many in-range (values, sm_scale, heads) keys a variant remembers.
_DERIVED_CHECKS_KEPT = 256
_VARIANTS: weakref.WeakValueDictionary[int, Variant] = weakref.WeakValueDictionary()


def live_variant(handle: int) -> Variant | None:
    """The variant whose ``handle`` this is, or None when it is no longer alive (a graph
    exported by ``torch.export`` may outlive it)."""
    return _VARIANTS.get(handle)


_SINGLE_PREFILL: Any = None


def _single_prefill() -> Any:
    # The wrappers load on first use (they register custom ops and need the build tools);
    # kept after that, so an eager call pays no import statement.
    global _SINGLE_PREFILL
    if _SINGLE_PREFILL is None:
        from attnc.runtime.wrappers.single_prefill import single_prefill

        _SINGLE_PREFILL = single_prefill
    return _SINGLE_PREFILL


def load(
    spec: str | os.PathLike[str] | None = None,
    variant: str | None = None,
    *,
    source: str | None = None,
) -> Variant:
    """Compile a `.attn` file path, ``stdlib:NAME`` or source text and return one variant.

    A path object (``pathlib.Path``) is always a file. An existing path is always read as a
    file, whatever characters its name holds; other text is taken as source only when it
    contains the word ``variant`` or a newline (else a missing file, as is text no path can
    hold). ``source=`` passes source text explicitly. ``variant`` picks one when the file
    defines several. Errors in the source raise :class:`attnc.AttnError`
    (``str()`` shows ``file:line:col``, the line and a caret).
    """
    from attnc.runtime.build.variant_cache import compile_cached

    text, file = spec_text(spec, source)
    compiled, warnings = compile_cached(text, file)
    if not compiled:
        raise ValueError(f"{printable(file)} defines no variant")
    if variant is None:
        if len(compiled) > 1:
            names = ", ".join(c.variant.name for c in compiled)
            raise ValueError(
                f"{printable(file)} defines several variants ({names}): pass variant=NAME"
            )
        return Variant(compiled[0], warnings)
    for c in compiled:
        if c.variant.name == variant:
            return Variant(c, warnings)
    names = ", ".join(c.variant.name for c in compiled)
    raise ValueError(
        f"{printable(file)} has no variant '{printable(str(variant))}'; it defines: {names}"
    )


def spec_text(spec: str | os.PathLike[str] | None, source: str | None = None) -> tuple[str, str]:
    """(source text, file name) of ``load``'s arguments (see ``load``)."""
    from attnc.compiler.sources import resolve_path, resolve_source

    if source is not None:
        if spec is not None:
            raise ValueError("load: pass a path or stdlib:NAME, or source=, not both")
        if not isinstance(source, str):
            raise ValueError(f"source: expected a str, got {type(source).__name__}")
        return source, "<string>"
    if isinstance(spec, os.PathLike):
        path = os.fspath(spec)
        if isinstance(path, str):
            return resolve_path(path)  # a path object is a file, never source text
    if not isinstance(spec, str):
        raise ValueError(
            f"spec: expected a path, stdlib:NAME or source text, got {shown_value(spec)}"
        )
    return resolve_source(spec)
