"""Owns: ``VariantMemo``, what the runtime works out once per variant and keeps with it (what
the mask reads and bounds, plan-time masks and KV ranges, the one-request prefill plans of
each thread). Each ``Variant`` makes its own in ``__init__``; copies and pickles of a variant
start with a new, empty one.

The planners fill it (``planning.plan_params``, ``planning.mask_ranges``,
``wrappers.single_prefill``); this module only holds the places. Threads share a variant's
memo: a field set once holds a value every thread computes alike (a race computes it twice),
the two bounded memos are written under ``mask_ranges``' lock, and the prefill plans are
each thread's own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planners import the runtime's variant module, not the reverse
    from attnc.runtime.planning.mask_ranges import PlannedMask, RangeProgram
    from attnc.runtime.planning.plan_params import MaskReads
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper


class ThreadPlans(threading.local):
    """One variant's planned ``Variant.prefill`` wrappers, each thread's own: ``by_key`` maps
    a plan's key (the stream, the shapes, the mask's scalars) to its wrapper, the least
    recently used first. The variant holds it (its wrappers reach the variant through a weak
    reference: the variant and its plans are freed when the caller drops it); a thread's
    wrappers and workspaces go when the thread ends."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[object, ...], BatchPrefillWrapper] = {}


@dataclass(eq=False, slots=True)
class VariantMemo:
    """The runtime's per-variant memo (see the module docstring); None: not computed yet."""

    mask_reads: MaskReads | None = None
    """``plan_params.mask_reads`` of the variant's IR."""
    tensor_param_names: frozenset[str] | None = None
    """The names of the variant's tensor params."""
    bound_names: tuple[frozenset[str], frozenset[str]] | None = None
    """``mask_ranges.bound_names``: the params the mask's bounds read, and those of them that
    are ``batch_size`` tensors."""
    prefill_mask_names: tuple[str, ...] | None = None
    """The params ``Variant.prefill`` gives its plans (``single_prefill._mask_names``)."""
    planned_masks: dict[tuple[object, ...], PlannedMask] = field(default_factory=dict)
    """``PlannedMask.from_plan_params`` by plan-time scalar values (bounded, oldest out)."""
    closed_form_ranges: dict[tuple[object, ...], RangeProgram | None] = field(default_factory=dict)
    """``mask_ranges._closed_form`` by the bounds' scalar values (bounded, oldest out)."""
    prefill_plans: ThreadPlans = field(default_factory=ThreadPlans)
    """The calling thread's planned ``Variant.prefill`` wrappers."""
