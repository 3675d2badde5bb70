"""The device step of a plan that does not wait for its tile map (attnc/item_map_order.cuh),
its CPU reference run on random maps and work lists against brute force: every item's KV
range is cut to the span of the non-EMPTY map columns it touches (empty when none), the items
are ordered by how many such columns they have, largest first, ties in list order, and item
0's counters start at 0."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

BLOCK = 64
KEYS = 4096  # kItemOrderKeys


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return build_host_fixture("item_order_host.cu", tmp_path_factory.mktemp("io") / "io")


def _oracle(kv_len, q_tiles, maps, items):
    rows = []
    for it in items:
        r, qt, b, e = (
            int(it[0]),
            int(it[1]),
            max(int(it[3]), 0),
            min(int(it[4]), kv_len[int(it[0])]),
        )
        row = maps[r][qt]
        cols = [c for c in range(b // BLOCK, (e - 1) // BLOCK + 1) if e > b and row[c] != 0]
        out = list(it)
        if cols:
            out[3], out[4] = max(b, cols[0] * BLOCK), min(e, (cols[-1] + 1) * BLOCK)
        else:
            out[3] = out[4] = b
        out[6] = out[7] = 0
        rows.append((min(len(cols), KEYS - 1), out))
    order = sorted(range(len(rows)), key=lambda i: (-rows[i][0], i))  # stable, largest first
    return [rows[i][1] for i in order]


def _case(rng, batch):
    kv_len = [int(x) for x in rng.integers(1, 700, batch)]
    q_tiles = [int(x) for x in rng.integers(1, 5, batch)]
    maps = [
        rng.choice([0, 1, 2], size=(q_tiles[b], -(-kv_len[b] // BLOCK)), p=[0.5, 0.3, 0.2])
        for b in range(batch)
    ]
    items = []
    for b in range(batch):
        for qt in range(q_tiles[b]):
            for head in range(2):
                lo = int(rng.integers(-3, kv_len[b]))
                hi = int(rng.integers(lo, kv_len[b] + 40))
                items.append([b, qt, head, lo, hi, int(rng.integers(-1, 3)), 5, 9])
    return kv_len, q_tiles, maps, np.array(items, dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_items_cut_and_ordered_by_the_map(binary, seed):
    rng = np.random.default_rng(seed)
    kv_len, q_tiles, maps, items = _case(rng, int(rng.integers(1, 6)))
    text = [f"{BLOCK} {len(kv_len)}", " ".join(map(str, kv_len)), " ".join(map(str, q_tiles))]
    text += [" ".join(str(int(v)) for v in m.ravel()) for m in maps]
    text += [str(len(items))] + [" ".join(str(int(v)) for v in it) for it in items]
    run = subprocess.run(
        [str(binary)], input="\n".join(text) + "\n", capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    got = [[int(x) for x in line.split()] for line in run.stdout.splitlines()]
    assert got == _oracle(kv_len, q_tiles, maps, items)
