"""benchmarks.plan_balance's models on small inputs: the static walk hands out items in
alternating rounds as the kernel's walk does (sm90/item_order.cuh), the dynamic fetch gives each
item to the first free CTA, and an item's work counts the non-EMPTY blocks of its causal range
within its chunk."""

from __future__ import annotations

import numpy as np

from benchmarks import plan_balance as pb


def test_static_walk_alternates_direction_per_round():
    costs = np.array([10, 9, 8, 7, 6, 5, 4], dtype=float)
    # round 0: CTA 0 <- 10, CTA 1 <- 9, CTA 2 <- 8; round 1 (reversed): CTA 2 <- 7, 1 <- 6,
    # 0 <- 5; round 2: CTA 0 <- 4.
    assert pb.static_walk_loads(costs, 3).tolist() == [19.0, 15.0, 15.0]


def test_dynamic_fetch_gives_the_next_item_to_the_first_free_cta():
    costs = np.array([10, 1, 1, 1, 1, 1], dtype=float)
    loads = pb.dynamic_fetch_loads(costs, 2)
    assert sorted(loads.tolist()) == [5.0, 10.0]
    assert loads.sum() == costs.sum()


def test_item_work_counts_non_empty_blocks_in_the_causal_range():
    classes = np.array([[1, 0, 0, 0], [0, 2, 1, 0]], dtype=np.uint8)  # 2 query tiles x 4 blocks
    tile = pb.TILE_Q
    items = np.array([
        [0, 0, 0, 0, 1 << 20, -1, 0, 0],  # tile 0: keys [0, 48): block 0
        [0, 1, 0, 0, 1 << 20, -1, 0, 0],  # tile 1: keys [0, 96): blocks 0-1, one non-EMPTY
        [0, 1, 0, 64, 96, 0, 0, 0],  # a chunk of tile 1: block 1 only
        [0, 5, 0, 0, 64, -1, 0, 0],  # past the request's query tiles
    ], dtype=np.int32)  # fmt: skip
    assert 2 * tile == 96
    assert pb.item_work(items, classes, item_cost=0.5).tolist() == [1.5, 1.5, 1.5, 0.0]


def test_item_cost_out_of_range_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        pb.main(["--item-cost", "-1"])
    assert "--item-cost must be in [0, 1000], got -1.0" in capsys.readouterr().err
