"""The runtime's per-variant memo (``Variant.memo``): each value is worked out once and kept
there (not among the variant's attributes), copies start with an empty one, and the
one-request prefill plans it holds are each thread's own."""

from __future__ import annotations

import copy
import pickle
import threading

import attnc
from attnc.runtime.planning.mask_ranges import PlannedMask, bound_names
from attnc.runtime.planning.plan_params import split_plan_params, variant_mask_reads
from attnc.runtime.variant_memo import VariantMemo
from attnc.runtime.wrappers.single_prefill import thread_plans


def _filled(variant: attnc.Variant) -> None:
    """Ask every planner memo of ``variant`` once."""
    variant_mask_reads(variant)
    bound_names(variant)
    PlannedMask.from_plan_params(variant, {"window": 4})
    sizes = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "batch_size": 1, "q_len": 1}
    split_plan_params(variant, {"window": 4}, sizes=sizes, device="cpu")


def test_the_memo_holds_each_value_once() -> None:
    variant = attnc.load("stdlib:sliding_window")
    before = set(vars(variant))
    _filled(variant)
    memo = variant.memo
    assert variant_mask_reads(variant) is memo.mask_reads is not None
    assert bound_names(variant) is memo.bound_names == (frozenset({"window"}), frozenset())
    assert memo.tensor_param_names == frozenset()
    planned = PlannedMask.from_plan_params(variant, {"window": 4})
    assert memo.planned_masks == {(("window", int, 4),): planned}
    assert set(vars(variant)) == before  # nothing kept beside the memo


def test_a_copy_starts_with_an_empty_memo() -> None:
    variant = attnc.load("stdlib:sliding_window")
    _filled(variant)
    thread_plans(variant)[("key",)] = None
    for twin in (copy.copy(variant), copy.deepcopy(variant), pickle.loads(pickle.dumps(variant))):
        assert twin.memo is not variant.memo
        assert _empty(twin.memo)
        assert thread_plans(twin) == {}


def _empty(memo: VariantMemo) -> bool:
    return (
        memo.mask_reads is None
        and memo.bound_names is None
        and not memo.planned_masks
        and not memo.closed_form_ranges
    )


def test_prefill_plans_are_each_threads_own() -> None:
    variant = attnc.load("stdlib:causal")
    mine = thread_plans(variant)
    assert thread_plans(variant) is mine
    seen: list[dict] = []
    worker = threading.Thread(target=lambda: seen.append(thread_plans(variant)))
    worker.start()
    worker.join()
    assert seen[0] is not mine and seen[0] == {}
