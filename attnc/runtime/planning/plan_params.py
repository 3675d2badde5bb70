"""Owns: the params given to ``plan(params=...)``: their checks (scalars as at run time,
tensors against the heads and the batch's lengths), what the mask reads of them, and the
keys by which ``plan()`` knows it was given them before. The stamps of the planned tensors
are ``tensor_stamps``'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnc.compiler import ir
from attnc.compiler.token_index import token_tensors_read
from attnc.runtime.checks.params import (
    TORCH_DTYPES,
    check_plan_params,
    declared_shape,
    resolve_params,
)
from attnc.runtime.checks.tensors import is_dense, negated_view
from attnc.runtime.value_keys import value_key

if TYPE_CHECKING:  # annotations only: the planners need no import of the variant module
    from attnc.runtime.variant import Variant


@dataclass(frozen=True)
class MaskReads:
    """What a variant's mask reads: every param, the per-token tensors (dims ``kv_len`` or
    ``q_len``, ``token_index.token_tensors_read``: the mask cannot be classified in closed
    form, a tile map is built), and whether it reads a head index."""

    params: frozenset[str]
    token_tensors: tuple[str, ...]
    reads_heads: bool

    @property
    def needs_tile_map(self) -> bool:
        """True when the mask reads a per-token tensor (``kMaskReadsTokens``)."""
        return bool(self.token_tensors)


def mask_reads(variant_ir: ir.VariantIR) -> MaskReads:
    """The ``MaskReads`` of a variant's IR."""
    if variant_ir.mask is None:
        return MaskReads(frozenset(), (), False)
    names: set[str] = set()
    heads = False
    for n in ir.walk(variant_ir.mask):
        if isinstance(n, ir.ParamRef | ir.TensorLoad):
            names.add(n.name)
        elif isinstance(n, ir.Builtin) and n.name in ("qo_head", "kv_head"):
            heads = True
    tokens = token_tensors_read(variant_ir.mask, variant_ir.params)
    return MaskReads(frozenset(names), tokens, heads)


def plan_value(
    decl: ir.ParamDecl, scalars: Mapping[str, object], tensors: Mapping[str, torch.Tensor]
) -> object | None:
    """The value ``plan()`` has for param ``decl``: the tensor or scalar given, else its
    default (None: neither). The tile map is built with these values."""
    given = tensors.get(decl.name, scalars.get(decl.name))
    return decl.default if given is None else given


def variant_mask_reads(variant: Variant) -> MaskReads:
    """``mask_reads`` of a variant's IR, remembered in the variant's memo."""
    found = variant.memo.mask_reads
    if found is None:
        found = variant.memo.mask_reads = mask_reads(variant.ir)
    return found


def _tensor_decls(variant: Variant) -> frozenset[str]:
    """Names of the variant's tensor params, remembered in the variant's memo."""
    found = variant.memo.tensor_param_names
    if found is None:
        decls = variant.params
        found = frozenset(d.name for d in decls if d.kind == "tensor")
        variant.memo.tensor_param_names = found
    return found


def _passes(decl: ir.ParamDecl, value: object, sizes: Mapping[str, int], device: object) -> bool:
    """True when ``value`` passes ``resolve_params``'s tensor checks unchanged (its declared
    dtype and shape, ``device``, contiguous, no negative bit); anything else goes through
    those checks."""
    if not isinstance(value, torch.Tensor) or not is_dense(value) or negated_view(value):
        return False
    try:
        shape = declared_shape(decl, sizes)
    except KeyError:  # a size not known here: the checks name it
        return False
    return (
        tuple(value.shape) == shape
        and value.dtype == TORCH_DTYPES.get(decl.dtype)
        and value.device == device
        and value.is_contiguous()
    )


def split_plan_params(
    variant: Variant,
    params: Mapping[str, object],
    *,
    sizes: Mapping[str, int],
    device: torch.device,
) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """Check ``params`` given to ``plan()``: (scalars, tensors). Scalars as ``run()`` checks
    them; tensors for their dtype, device and shape, with ``sizes`` holding the head counts,
    head_dim and the batch sizes (``checks.params.token_sizes``)."""
    if not params:
        return {}, {}
    name = variant.name
    decls = variant.params
    tensor_decls_of = _tensor_decls(variant)
    scalars = {k: v for k, v in params.items() if k not in tensor_decls_of}
    checked = check_plan_params(decls, scalars, variant_name=name) if scalars else {}
    if len(scalars) == len(params):
        return checked, {}
    given = {k: v for k, v in params.items() if k in tensor_decls_of}
    tensor_decls = tuple(d for d in decls if d.name in given)
    if all(_passes(d, given[d.name], sizes, device) for d in tensor_decls):
        return checked, {d.name: given[d.name] for d in tensor_decls}  # type: ignore[misc]
    heads = {k: sizes[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim")}
    batch = {k: v for k, v in sizes.items() if k not in heads}
    resolved = resolve_params(
        tensor_decls, given, variant_name=name, device=device, batch_sizes=batch, **heads
    )
    for key, value in given.items():
        if resolved[key] is not value:
            raise ValueError(
                f"variant '{name}': param '{key}': plan() needs a contiguous tensor (run() "
                "must be given the same tensor)"
            )
    return checked, {k: v for k, v in resolved.items() if isinstance(v, torch.Tensor)}


def params_keys(
    params: Mapping[str, object],
) -> tuple[tuple[object, ...] | None, tuple[object, ...]] | None:
    """What ``plan()`` reads of its ``params``: (the values themselves, scalars by
    ``value_key``, or None when a tensor is among them: its values are read on every plan,
    as a write torch does not count cannot be told from none; what their checks read:
    scalars likewise, tensors by shape, strides, dtype and device), or None when a value
    cannot be compared so."""
    checked: list[object] = []
    with_tensors = False
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            if not is_dense(value) or value.is_neg():  # the metadata hides the negative bit
                return None
            checked.append((name, value.shape, value.stride(), value.dtype, value.device))
            with_tensors = True
        elif isinstance(value, int | float | bool):
            checked.append((name, *value_key(value)))
        else:
            return None
    return (None if with_tensors else tuple(checked)), tuple(checked)
