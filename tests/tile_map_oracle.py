"""The doc_causal tile map by brute force (numpy, every pair): the reference the device and
host classifiers are tested against. Importable from every test tier as ``import
tile_map_oracle`` (pytest puts tests/, the folder of tests/conftest.py, on ``sys.path``).
"""

from __future__ import annotations

import numpy as np


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
