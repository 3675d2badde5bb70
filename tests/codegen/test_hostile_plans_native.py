"""Hostile plans that need the built native planners (nvcc, host code only): sizes near the
kernels' int32 limits are refused with a ValueError naming the argument, and a refused plan
leaves the previous one in force."""

from __future__ import annotations

import pytest
import torch
from test_decode_plan_step import _plan, cpu, lib, make_wrapper  # noqa: F401 (fixtures)

pytestmark = pytest.mark.nvcc

I32_MAX = 2**31 - 1


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_decode_kv_tokens_past_int32_are_refused_for_a_kv_len_param(cpu) -> None:  # noqa: F811
    """kv_token_start and the size of a kv_len tensor wrapped at 2^32: five requests of 2^30
    tokens (one shared page of 2^20 tokens, 1024 times each) planned a doc tensor of 2^30
    entries, and the kernels indexed it from wrapped (negative) starts."""
    w = make_wrapper(name="doc_causal")
    w._reads_kv_tokens = True
    page = 1 << 20
    _plan(w, _i32([0, 1]), _i32([0]), _i32([5]), page_size=page)
    assert w._token_sizes["kv_len"] == 5
    batch, pages = 5, 1024
    indptr = _i32([pages * i for i in range(batch + 1)])
    ids, last = _i32([0] * (pages * batch)), _i32([page] * batch)
    with pytest.raises(ValueError, match=r"^kv_indptr: the batch holds 5368709120 KV tokens"):
        _plan(w, indptr, ids, last, page_size=page)
    assert w._token_sizes["kv_len"] == 5 and w._batch == 1  # the previous plan stands


def test_decode_kv_within_a_tile_margin_of_int32_is_refused(cpu) -> None:  # noqa: F811
    """A request of 2^31 - 2^16 + 1 tokens (2048 repeats of one page of 2^20 tokens, the last
    shorter) is refused: the kernels' tile arithmetic (kv0 + tile, (end - begin + tile - 1) /
    tile) wrapped for a request within a tile of 2^31 tokens. 2^31 - 2^16 tokens plan."""
    from attnc.runtime.checks.limits import MAX_KV_TOKENS
    from attnc.runtime.planning.decode_plan import OUT_OF_RANGE_MESSAGE

    w = make_wrapper()
    page, pages = 1 << 20, 2048
    indptr, ids = _i32([0, pages]), _i32([0] * pages)
    last = MAX_KV_TOKENS - (pages - 1) * page
    _plan(w, indptr, ids, _i32([last]), page_size=page)
    assert w._batch == 1
    with pytest.raises(ValueError) as info:
        _plan(w, indptr, ids, _i32([last + 1]), page_size=page)
    assert str(info.value) == (  # named as prefill names it (the planner's generic text before)
        f"kv_indptr: request 0 holds {MAX_KV_TOKENS + 1} KV tokens (2048 pages of "
        f"page_size=1048576), more than the kernels' limit {MAX_KV_TOKENS} (int32 less a "
        "margin for their tile arithmetic)"
    )
    assert str(info.value) != OUT_OF_RANGE_MESSAGE
