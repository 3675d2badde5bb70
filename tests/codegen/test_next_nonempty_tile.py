"""The KV tile walk both prefill kernels share (attnc/tile_map_view.cuh: next_nonempty_tile) on
the CPU: from tile t of an item's range [begin, end) cut into kv_tile-key tiles, the first tile
whose keys are not all EMPTY in the tile map and its class (the last tile cut at end), against
brute force; a variant without a mask takes every tile as FULL."""

from __future__ import annotations

import subprocess

import numpy as np
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

BLOCK = 64
EMPTY, FULL, PARTIAL = 0, 1, 2


def tile_class(cols: np.ndarray, kv0: int, kv1: int) -> int:
    """The class of keys [kv0, kv1) from the map columns they touch."""
    touched = cols[kv0 // BLOCK : (kv1 - 1) // BLOCK + 1]
    if (touched == EMPTY).all():
        return EMPTY
    return FULL if (touched == FULL).all() else PARTIAL


def expected_walk(cols: np.ndarray, kv_tile: int, begin: int, end: int, t: int) -> tuple[int, int]:
    """(tile, class) the walk must answer: num_tiles and the last class seen when none is left."""
    num_tiles = -(-(end - begin) // kv_tile) if end > begin else 0
    cls = FULL
    while t < num_tiles:
        kv0 = begin + t * kv_tile
        cls = tile_class(cols, kv0, min(kv0 + kv_tile, end))
        if cls != EMPTY:
            break
        t += 1
    return t, cls


def test_next_nonempty_tile_matches_brute_force(tmp_path):
    binary = tmp_path / "next_tile_host"
    build_host_fixture("next_tile_host.cu", binary)

    rng = np.random.default_rng(1)
    kv_len = 1500
    cols = rng.choice([EMPTY, FULL, PARTIAL], size=-(-kv_len // BLOCK), p=[0.5, 0.3, 0.2])
    queries = []
    for _ in range(400):
        kv_tile = int(rng.choice([16, 32, 64, 128]))
        begin = int(rng.integers(0, kv_len))
        end = int(rng.integers(begin, kv_len + 1))
        num_tiles = -(-(end - begin) // kv_tile)
        queries.append((kv_tile, begin, end, int(rng.integers(0, num_tiles + 2))))
    text = [f"{BLOCK} {len(cols)}", " ".join(map(str, cols.tolist()))]
    text += [" ".join(map(str, q)) for q in queries]
    run = subprocess.run([str(binary)], input="\n".join(text) + "\n", capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(queries)
    for (kv_tile, begin, end, t), line in zip(queries, lines, strict=True):
        tile, cls, plain, plain_cls, _ = map(int, line.split())
        want = expected_walk(cols, kv_tile, begin, end, t)
        assert (tile, cls) == want, (kv_tile, begin, end, t)
        assert (plain, plain_cls) == (t, FULL)
