"""benchmarks.doc_order_probe's re-ordering of a plan's work items (no GPU): every order is a
permutation of the planned rows, item 0's counter words stay 0, and the closed-form order
sorts by the query tile's end, heaviest first, ties in planned order."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import doc_order_probe as dop


def _items() -> np.ndarray:
    rows = [
        # request, q_tile, kv_head, kv_begin, kv_end, part_row, spare, spare
        [0, 3, 0, 128, 1 << 20, -1, 0, 0],
        [0, 7, 1, 0, 1 << 20, -1, 0, 0],
        [0, 3, 1, 64, 1 << 20, -1, 0, 0],
        [0, 5, 0, 0, 1 << 20, -1, 0, 0],
    ]
    return np.array(rows, dtype=np.int32)


@pytest.mark.parametrize("order", sorted(set(dop.ORDERS)))
def test_every_order_permutes_the_rows_and_keeps_counters_zero(order):
    items = _items()
    items[0, dop.PI_COUNTERS] = (5, 2)  # a kernel's counts left in item 0
    out = dop.reorder(items, order)
    assert (out[0, dop.PI_COUNTERS] == 0).all()
    unset = items.copy()
    unset[:, dop.PI_COUNTERS] = 0
    assert sorted(map(tuple, out.tolist())) == sorted(map(tuple, unset.tolist()))


def test_closed_form_is_heaviest_query_tile_first_ties_in_planned_order():
    out = dop.reorder(_items(), "closed_form")
    assert out[:, 1].tolist() == [7, 5, 3, 3]
    assert out[2:, 2].tolist() == [0, 1]  # the two q_tile 3 items in planned order


def test_reversed_and_by_head():
    items = _items()
    assert dop.reorder(items, "reversed")[:, 1].tolist() == [5, 3, 7, 3]
    assert dop.reorder(items, "by_head")[:, 2].tolist() == [0, 0, 1, 1]


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match="unknown 'sideways'"):
        dop.reorder(_items(), "sideways")
