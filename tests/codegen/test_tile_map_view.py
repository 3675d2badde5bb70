"""The prefill kernels' reading of a plan's tile map (attnc/tile_map_view.cuh) on the CPU: the
map row of (request, query tile) and the class of any KV tile [kv0, kv1), unaligned to the map's
64-key columns too (all EMPTY -> EMPTY, all FULL -> FULL, else PARTIAL), against brute force;
no map (or a closed-form variant) falls back to classify()."""

from __future__ import annotations

import subprocess

import numpy as np
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

BLOCK = 64


def test_tile_classes_from_the_map_match_brute_force(tmp_path):
    binary = tmp_path / "tile_map_host"
    build_host_fixture("tile_map_host.cu", binary)

    rng = np.random.default_rng(0)
    kv_lens = [1, 63, 64, 65, 700, 1000]
    q_tiles = [1, 2, 1, 3, 4, 2]
    maps = []
    for kv, qt in zip(kv_lens, q_tiles, strict=True):
        cols = -(-kv // BLOCK)
        # Runs of equal classes so that multi-column tiles are often uniform.
        base = rng.integers(0, 3, size=(qt, cols))
        runs = rng.random((qt, cols)) < 0.6
        for c in range(1, cols):
            base[:, c] = np.where(runs[:, c], base[:, c - 1], base[:, c])
        maps.append(base.astype(np.uint8))
    queries = []
    for b, kv in enumerate(kv_lens):
        for qt in range(q_tiles[b]):
            for _ in range(60):
                kv0 = int(rng.integers(0, kv))
                kv1 = int(rng.integers(kv0 + 1, min(kv, kv0 + 300) + 1))
                queries.append((b, qt, kv0, kv1))
    text = [f"{BLOCK} {len(kv_lens)}", " ".join(map(str, kv_lens)), " ".join(map(str, q_tiles))]
    text += [" ".join(map(str, m.reshape(-1).tolist())) for m in maps]
    text += [" ".join(map(str, q)) for q in queries]
    run = subprocess.run([str(binary)], input="\n".join(text) + "\n", capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(queries)
    for (b, qt, kv0, kv1), line in zip(queries, lines, strict=True):
        got, _, fallback, _, closed = line.split()
        cols = maps[b][qt, kv0 // BLOCK : (kv1 - 1) // BLOCK + 1]
        want = 0 if (cols == 0).all() else 1 if (cols == 1).all() else 2
        assert int(got) == want, (b, qt, kv0, kv1, cols)
        assert int(fallback) == 2 and int(closed) == 1
