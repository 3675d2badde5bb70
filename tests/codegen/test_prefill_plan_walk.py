"""The work list placed for the Hopper kernel's alternating walk (prefill_plan_walk.h): the
C++ planner against the numpy oracle (balance_walk) on plans of two to five items a CTA, the
placed list a permutation of the heaviest-first one, and the balance it buys on causal
prefills of 2048, 2560 and 3584 tokens (RESULTS.md runs 39 to 41)."""

from __future__ import annotations

import numpy as np
import prefill_schedule_oracle as oracle
import pytest
import torch
from mask_ranges_oracle import tile_kv_ranges
from prefill_plan_helpers import PlanShape, make_host_plan

import attnc
from attnc.runtime.build import toolchain
from attnc.runtime.planning.mask_ranges import tile_range_program

pytestmark = pytest.mark.nvcc

try:
    toolchain.find_nvcc()
except toolchain.ToolNotFound:
    pytest.skip("nvcc not found", allow_module_level=True)

CAUSAL = "mask = kv_idx <= q_pos;"


def _ranges(body: str):
    analysis = attnc.load(source=f"variant v {{\n {body}\n}}").compiled.mask_analysis
    return tile_kv_ranges(analysis, {}), tile_range_program(analysis, {})


def _indptr(lengths) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def _plans(q, kv, shape, body):
    ranges, program = _ranges(body) if body else (None, None)
    qo, kvp = _indptr(q), _indptr(kv)
    want = oracle.oracle_plan(qo, kvp, None, None, 1, shape, ranges)
    got = make_host_plan(qo, kvp, None, None, 1, shape, program)
    return got, want


def _cta_loads(items: np.ndarray, cost_of, g: int) -> np.ndarray:
    """Per-CTA sums of cost_of(item row) over the walk's positions."""
    n = items.shape[0]
    q = np.arange(n)
    r, k = q // g, q % g
    cta = np.where(r % 2 == 0, k, g - 1 - k)
    loads = np.zeros(g)
    np.add.at(loads, cta, [cost_of(row) for row in items])
    return loads


def _walk_case(seed: int):
    """A random batch and its shapes without and with a walk of two to five items a CTA."""
    rng = np.random.default_rng(1000 + seed)
    batch = int(rng.integers(1, 6))
    q = rng.integers(1, 900, batch)
    kv = q + rng.integers(0, 1200, batch)
    hq, hkv = [(4, 4), (8, 2), (32, 8), (6, 1)][seed % 4]
    tile = int(rng.choice([16, 32, 64]))
    body = [CAUSAL, "", "mask = kv_idx <= q_pos && q_pos - kv_idx < 200;"][seed % 3]
    flat = PlanShape(hq, hkv, 128, tile, 132, 1 << 26)
    items = _plans(q, kv, flat, body)[1].schedule.items.shape[0]
    walk = int(rng.integers(-(-items // 5), max(items - 1, 1) + 1))
    shape = PlanShape(hq, hkv, 128, tile, 132, 1 << 26, walk_ctas=walk)
    return q, kv, flat, shape, body


@pytest.mark.parametrize("seed", range(120))
def test_walk_plans_identical_and_a_permutation(seed):
    q, kv, flat, shape, body = _walk_case(seed)
    got, want = _plans(q, kv, shape, body)
    assert np.array_equal(got.buffer, want.packed)
    assert np.array_equal(got.schedule.items, want.schedule.items)
    heaviest_first = _plans(q, kv, flat, body)[0].schedule.items
    key = lambda rows: sorted(map(tuple, rows.tolist()))  # noqa: E731
    assert key(got.schedule.items) == key(heaviest_first)


def test_walk_moves_items_in_many_of_those_plans():
    """The comparison above is not only of lists the walk left alone."""
    moved = 0
    for seed in range(120):
        q, kv, flat, shape, body = _walk_case(seed)
        placed = _plans(q, kv, shape, body)[1].schedule.items
        moved += not np.array_equal(placed, _plans(q, kv, flat, body)[1].schedule.items)
    assert moved >= 20


@pytest.mark.parametrize(
    ("length", "walk_alone", "placed"),
    [(2048, 1.10, 1.02), (2560, 1.05, 1.015), (3584, 1.03, 1.01)],
)
def test_walk_balances_a_causal_prefill(length, walk_alone, placed):
    """One causal request, 32/8 heads, 48-token tiles over 132 CTAs (three, four and five items
    a CTA): the walk of the heaviest-first list leaves its busiest CTA ``walk_alone`` or more
    above the mean; placed for the walk, below ``placed``. Costs are the planner's (tokens +
    KV) plus the item switch."""
    ranges, program = _ranges(CAUSAL)
    qo = _indptr([length])
    flat = PlanShape(32, 8, 128, 48, 132, 1 << 26)
    walk = PlanShape(32, 8, 128, 48, 132, 1 << 26, walk_ctas=132)
    plain = make_host_plan(qo, qo, None, None, 1, flat, program).schedule.items
    placed_items = make_host_plan(qo, qo, None, None, 1, walk, program).schedule.items

    def cost(row):
        tokens = min(48, length - int(row[1]) * 48)
        return tokens + (int(row[4]) - int(row[3])) + oracle.WALK_ITEM_COST

    before, after = _cta_loads(plain, cost, 132), _cta_loads(placed_items, cost, 132)
    assert before.sum() == pytest.approx(after.sum())
    assert before.max() / before.mean() > walk_alone
    assert after.max() / after.mean() < placed
    assert ranges is not None


@pytest.mark.parametrize("walk", [-1, 1 << 30])
def test_walk_ctas_beyond_the_limits_is_refused(walk):
    qo = torch.tensor([0, 100])
    shape = PlanShape(4, 2, 64, 32, 4, 1 << 20, walk_ctas=walk)
    with pytest.raises(ValueError, match="beyond the planner's limits"):
        make_host_plan(qo, qo, None, None, 1, shape)
