"""The tile map in numpy: the doc_causal map by brute force (every pair), the reference the
device and host classifiers are tested against; and each request's map start and the
per-query-tile summary of a map, the references of the host planner's
(``attnc_prefill_map_starts``, ``attnc_prefill_map_summary``: ``PrefillPlanner.map_starts``
and ``attnc.runtime.planning.tile_map.summarize``) and the inputs of the prefill schedule
oracle (tests/codegen/prefill_schedule_oracle.py). Not used by the runtime. Importable from
every test tier as ``import tile_map_oracle`` (pytest puts tests/, the folder of
tests/conftest.py, on ``sys.path``).
"""

from __future__ import annotations

import numpy as np

from attnc.runtime.abi import TILE_EMPTY, TILE_MAP_KV_BLOCK
from attnc.runtime.planning.tile_map import TileMapSummary, map_entries


def doc_causal_map(doc, q_lens, kv_lens, tile: int, block: int = 64) -> np.ndarray:
    """uint8 classes (EMPTY 0, FULL 1, PARTIAL 2) of every (query tile, KV block) box of
    ``kv_idx <= q_pos && doc[kv_idx] == doc[q_pos]``, requests in order; ``doc`` holds the
    document id of every KV token of the batch, flattened over requests."""
    out, start = [], 0
    for ql, kl in zip(q_lens, kv_lens, strict=True):
        d = doc[start : start + kl]
        q_pos = np.arange(ql) + kl - ql
        vis = (np.arange(kl)[None, :] <= q_pos[:, None]) & (d[None, :] == d[q_pos][:, None])
        for q0 in range(0, ql, tile):
            for k0 in range(0, kl, block):
                box = vis[q0 : q0 + tile, k0 : k0 + block]
                out.append(0 if not box.any() else (1 if box.all() else 2))
        start += kl
    return np.array(out, dtype=np.uint8)


def map_starts(
    q_lens: np.ndarray, kv_lens: np.ndarray, tile_q_tokens: int, kv_block: int = TILE_MAP_KV_BLOCK
) -> np.ndarray:
    """int64 ``[batch + 1]``: where each request's map starts (the last value: map bytes)."""
    q, kv = np.asarray(q_lens, dtype=np.int64), np.asarray(kv_lens, dtype=np.int64)
    entries = map_entries(q, kv, tile_q_tokens, kv_block)
    return np.concatenate([[0], np.cumsum(entries)]).astype(np.int64)


def summarize(
    tile_map: np.ndarray,
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    tile_q_tokens: int,
    kv_block: int = TILE_MAP_KV_BLOCK,
) -> TileMapSummary:
    """The ``TileMapSummary`` of a host copy of the map (uint8 ``[entries]``)."""
    q = np.asarray(q_lens, dtype=np.int64)
    cols = -(-np.asarray(kv_lens, dtype=np.int64) // kv_block)
    rows = -(-q // tile_q_tokens)
    starts = map_starts(q_lens, kv_lens, tile_q_tokens, kv_block)
    req = np.repeat(np.arange(q.shape[0], dtype=np.int64), rows)
    j = np.arange(req.shape[0], dtype=np.int64) - (np.cumsum(rows) - rows)[req]
    row_start = starts[req] + j * cols[req]
    nonempty = np.asarray(tile_map, dtype=np.uint8)[: int(starts[-1])] != TILE_EMPTY
    cumulative = np.concatenate([[0], np.cumsum(nonempty, dtype=np.int64)])
    first = np.zeros(req.shape[0], dtype=np.int64)
    end = np.zeros(req.shape[0], dtype=np.int64)
    width = cols[req]
    rows_with_cols = np.flatnonzero(width > 0)  # their rows tile the map, in order
    if rows_with_cols.size:
        at = np.arange(nonempty.shape[0], dtype=np.int64)
        begins = row_start[rows_with_cols]
        lo = np.minimum.reduceat(np.where(nonempty, at, np.iinfo(np.int64).max), begins)
        hi = np.maximum.reduceat(np.where(nonempty, at, -1), begins)
        hit = hi >= 0
        tiles = rows_with_cols[hit]
        first[tiles] = lo[hit] - begins[hit]
        end[tiles] = hi[hit] - begins[hit] + 1
    return TileMapSummary(row_start, first, end, cumulative, kv_block)
