"""Owns: the mask a decode ``plan()`` makes of its ``params`` (``DecodeMaskPlanning``, a base
of ``DecodePlanning``): the scalars and per-request tensors the mask's KV ranges are planned
from, checked once (tensor params with the sizes they are sized by), the key that lets a
repeated plan reuse the last planned mask, and the commit that makes a successful plan's mask
the one ``run()`` checks its params against. The rows' per-request columns are computed with
the planner in ``decode_planning.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from attnc.runtime.checks.params import describe_decl
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK, PlannedMask, bound_names
from attnc.runtime.planning.plan_params import split_plan_params
from attnc.runtime.value_keys import same_values
from attnc.runtime.wrappers.decode_calls import CachedCall
from attnc.runtime.wrappers.decode_plan_inputs import CheckedSizes, checked_sizes, scalar_key

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant

# The plan-time scalars (name and ``value_key``) a planned mask was made from; None: not reusable.
MaskKey = tuple[tuple[object, ...], ...] | None


# What ``_mask_ranges`` made of the params given to ``plan()``: the planned mask, its key and,
# when tensor params were sized by them, the checked sizes (None: nothing checked there). A
# plain tuple: one is made per plan() with params.
MaskPlan = tuple[PlannedMask, MaskKey, CheckedSizes | None]


class DecodeMaskPlanning:
    """The planned mask of a decode wrapper's ``plan()`` params (see the module docstring);
    the attributes below are set by ``DecodePlanning.__init__``."""

    variant: Variant
    _device: torch.device
    _calls: dict[tuple[object, ...], CachedCall]
    _planned_mask: PlannedMask
    # The plan-time scalars (name, type, value) the planned mask was made from.
    _mask_key: MaskKey = None

    def _mask_ranges(
        self, params: Mapping[str, object], sizes: tuple[object, ...] = ()
    ) -> MaskPlan:
        """The mask planned with the params given to ``plan()`` (scalars, and per-request
        ``batch_size`` tensors: one value per request) and its key, the values' types and
        values (None when tensors were given). Its ``program`` (the mask's KV ranges, its range
        rows) is None when the mask reads none of them (the C++ planner then plans whole
        requests). The same scalars as the last plan give its planned mask (the same rows
        object). Tensor params are checked against ``sizes`` (kv_indptr, the head counts,
        head_dim, q_len), checked first and handed on in the result. Nothing is set here:
        ``_commit_mask`` does that once the plan succeeded, so a refused plan leaves the values
        ``run()`` must match as they were."""
        key = scalar_key(params)
        if key is not None and key == self._mask_key:
            return self._planned_mask, key, None
        tensor_names = {d.name for d in self.variant.params if d.kind == "tensor"}
        checked = None
        if sizes and any(name in tensor_names for name in params):
            _refuse_per_key_tensors(self.variant, params)
            checked = checked_sizes(*sizes)
            batch = int(checked.kv_indptr.numel()) - 1
            counts = {
                "num_qo_heads": checked.num_qo_heads, "num_kv_heads": checked.num_kv_heads,
                "head_dim": checked.head_dim, "batch_size": batch, "q_len": batch * checked.q_len,
            }  # fmt: skip
            scalars, given = split_plan_params(
                self.variant, params, sizes=counts, device=self._device
            )
            planned = PlannedMask.from_values(self.variant, scalars, given)
        else:
            planned = PlannedMask.from_plan_params(self.variant, params)
        if not planned.tensors and planned.values.keys().isdisjoint(bound_names(self.variant)[0]):
            # No bound to cut the KV by (soft-cap's cap, say): the C++ planner plans whole
            # requests; the values stay for run()'s check.
            planned = PlannedMask(planned.values) if planned.values else NO_PLANNED_MASK
        return planned, (key if not planned.tensors else None), checked

    def _commit_mask(self, mask: MaskPlan | None) -> None:
        """Make a successful plan's mask (from ``_mask_ranges``; None: unchanged) the one
        ``run()`` checks its params against, dropping cached calls when its values changed
        (or tensors were planned) so the next ``run()`` checks."""
        if mask is None:
            return
        planned, key, _ = mask
        last = self._planned_mask
        if planned.tensors or (
            planned is not last and not same_values(planned.values, last.values)
        ):
            self._calls.clear()
        self._planned_mask = planned
        self._mask_key = key


def _refuse_per_key_tensors(variant: Variant, params: Mapping[str, object]) -> None:
    """A decode ``plan()`` sizes KV ranges from scalars and per-request tensors: a tensor of
    one value per KV token (``[kv_len]``) belongs to ``run()``; say so, not its size."""
    name, decls = variant.name, variant.params
    for decl in decls:
        if decl.token_dim == "kv_len" and decl.name in params:
            raise ValueError(
                f"variant '{name}': param '{decl.name}' ({describe_decl(decl)}): "
                "decode plan() takes scalars and per-request tensors for the mask's KV ranges, "
                "not a tensor of one value per KV token: give it to run()"
            )
