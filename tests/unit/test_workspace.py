"""The workspace layouts (planning/workspace.py) and the page-table messages
(checks/page_table.py) with the planner's error codes mapped onto them."""

import pytest
import torch

from attnc.runtime import abi
from attnc.runtime.checks import page_table, tensors
from attnc.runtime.planning import workspace as w

LIMIT = 2**31 - 2**16  # MAX_QUERY_TOKENS == MAX_KV_TOKENS


def test_decode_layout_regions_are_ordered_aligned_and_fit():
    lay = w.make_layout(1 << 20, max_batch=4, max_items=64, max_ctas=8, max_pages=100)
    offsets = [lay.header, lay.cta_indptr, lay.req_page_begin, lay.req_kv_len, lay.merge_items,
               lay.items, lay.page_ids, lay.partials]  # fmt: skip
    assert offsets == sorted(offsets) and all(o % w.ALIGN == 0 for o in offsets)
    assert lay.cta_indptr - lay.header >= w.HEADER_INTS * 4
    assert lay.page_ids - lay.items >= 64 * w.ITEM_INTS * 4
    assert lay.items - lay.merge_items >= 4 * w.MERGE_INTS * 4
    assert lay.partials - lay.page_ids >= 400
    assert lay.part_lse_offset(128) + 4 * lay.max_part_rows(128) <= lay.total_bytes
    assert lay.work_bytes(3) == lay.items + 3 * w.ITEM_INTS * 4


def test_decode_layout_too_small():
    with pytest.raises(w.CapacityError, match="workspace_buffer"):
        w.make_layout(4096, max_batch=256, max_items=16384, max_ctas=1056, max_pages=None)
    with pytest.raises(ValueError, match="must be positive"):
        w.make_layout(1 << 20, max_batch=0, max_items=64, max_ctas=8, max_pages=None)


def test_planner_codes_map_to_the_page_table_messages():
    cases = {
        abi.PT_INDPTR_EMPTY: ((0, 0, 0), page_table.indptr_empty()),
        abi.PT_INDPTR_START: ((0, 3, 0), page_table.indptr_start(3)),
        abi.PT_INDPTR_DECREASING: ((2, 1, 4), page_table.indptr_decreasing(2, 1, 4)),
        abi.PT_LAST_COUNT: ((3, 2, 0), page_table.wrong_count("kv_last_page_len", 3, 2)),
        abi.PT_LAST_RANGE: ((1, 17, 0), page_table.last_range(1, 17, 16)),
        abi.PT_BATCH_CAPACITY: ((0, 70, 0), page_table.batch_capacity(70, 64)),
        abi.PT_PAGE_CAPACITY: ((0, 900, 0), page_table.page_capacity(900, 800)),
        abi.PT_INDICES_SHORT: ((0, 5, 9), page_table.indices_short(5, 9)),
        abi.PT_INDEX_NEGATIVE: ((0, -2, 0), page_table.index_negative(-2)),
        abi.PT_QO_INDPTR_EMPTY: ((0, 0, 0), page_table.indptr_empty("qo_indptr")),
        abi.PT_QO_INDPTR_START: ((0, 3, 0), page_table.indptr_start(3, "qo_indptr")),
        abi.PT_QO_INDPTR_DECREASING: (
            (2, 1, 4),
            page_table.indptr_decreasing(2, 1, 4, "qo_indptr"),
        ),
        abi.PT_INDPTR_COUNT: ((0, 3, 4), page_table.indptr_count(3, 4)),
        abi.PT_QUERY_TOKENS: (
            (1, 9, 0),
            page_table.too_many_tokens("qo_indptr", "query", 1, 9, LIMIT),
        ),
        abi.PT_KV_TOKENS: (
            (2, 9, 3),
            page_table.too_many_tokens(
                "kv_indptr", "KV", 2, 9, LIMIT, page_table.pages_detail(3, 16)
            ),
        ),
    }
    for code, ((index, value, value2), want) in cases.items():
        got = page_table.planner_error(code, index, value, value2, 16, 64, 800)
        assert (type(got), str(got)) == (type(want), str(want)), code
    assert str(page_table.last_range(1, 17, 16)) == (
        "kv_last_page_len: kv_last_page_len[1]=17 is outside [1, page_size=16]"
    )
    assert str(page_table.planner_error(abi.PT_KV_TOKENS, 0, LIMIT + 1, -1, 16)) == (
        f"kv_indptr: request 0 holds {LIMIT + 1} KV tokens, more than the kernels' limit "
        f"{LIMIT} (int32 less a margin for their tile arithmetic)"
    )  # ragged KV: no pages to tell of
    assert isinstance(page_table.batch_capacity(70, 64), w.CapacityError)
    with pytest.raises(AssertionError, match="unknown page-table error code 99"):
        page_table.planner_error(99, 0, 0, 0, 16, 64, 800)


def test_prefill_checks_use_the_same_words():
    with pytest.raises(ValueError) as info:
        tensors.check_indptr("qo_indptr", torch.tensor([0, 3, 2], dtype=torch.int32))
    assert str(info.value) == str(page_table.indptr_decreasing(2, 2, 3, "qo_indptr"))
    with pytest.raises(ValueError) as info:
        tensors.check_kv_indices(torch.tensor([1, -4], dtype=torch.int32), 2)
    assert str(info.value) == str(page_table.index_negative(-4))
