"""The planner's view of a variant's mask: the KV range each query tile may see, when the
mask analysis can compute it from the request's lengths alone (no runtime params)."""

from __future__ import annotations

import numpy as np

from attnc.compiler import mask_tiles
from attnc.compiler.mask_analysis import MaskAnalysis
from attnc.runtime.prefill_schedule import TileRanges


def tile_kv_ranges(analysis: MaskAnalysis) -> TileRanges | None:
    """A ``TileRanges`` for the scheduler's cost model, or None when every tile may see the
    whole KV (no mask, an opaque mask, or one whose bounds need params given only to run())."""
    if analysis.kind not in ("linear", "union"):
        return None
    if not _param_free(analysis):
        return None

    def ranges(
        req: np.ndarray, q0: np.ndarray, q1: np.ndarray, q_lens: np.ndarray, kv_lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        begin = np.zeros(req.shape[0], dtype=np.int64)
        end = np.zeros(req.shape[0], dtype=np.int64)
        for i in range(req.shape[0]):
            r = int(req[i])
            env = {"q_len": int(q_lens[r]), "kv_len": int(kv_lens[r])}
            begin[i], end[i] = mask_tiles.kv_range(analysis, int(q0[i]), int(q1[i]), env)
        return begin, end

    return ranges


def _param_free(analysis: MaskAnalysis) -> bool:
    """True when the mask's bounds evaluate with q_len and kv_len alone."""
    try:
        mask_tiles.kv_range(analysis, 0, 1, {"q_len": 1, "kv_len": 1})
    except KeyError:
        return False
    return True
