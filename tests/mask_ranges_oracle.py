"""The numpy oracle of the planners' mask ranges: the reference the C++ evaluation of the range
rows (``attnc/kernels/host/mask_range_rows.h``, rows from ``mask_ranges.tile_range_program``)
is tested against. Not used by the runtime.

``query_tiles`` lists a batch's query tiles as the prefill planner does; ``tile_kv_ranges``
gives the KV range every query tile (prefill) may see and ``decode_spans``
the span every decode request's chunks cover, for a whole batch at once, by eliminating
``q_idx`` from each conjunction of the mask's linear bounds (``mask_tiles.project_kv`` on numpy
arrays); a request whose wrap guards may leave the i32 range sees its whole KV, as the kernel
does. ``attnc.compiler.mask_tiles.kv_range`` answers the same question for one tile in plain
Python. Pure numpy: importable from tests/unit without nvcc, as ``import mask_ranges_oracle``
(pytest puts tests/, the folder of tests/conftest.py, on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from attnc.compiler import mask_tiles
from attnc.compiler.mask_analysis import Conjunction, MaskAnalysis
from attnc.runtime.planning.mask_ranges import constants_per_request, plan_time_bounds


def query_tiles(
    q_lens: np.ndarray, tile_q_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(request, tile index, q_begin, q_end) of every query tile, requests in order (the
    tiles the prefill planner ranges, ``prefill_plan_ranges.h``)."""
    if tile_q_tokens <= 0:
        raise ValueError(f"tile_q_tokens: must be positive, got {tile_q_tokens}")
    q = np.asarray(q_lens, dtype=np.int64)
    n = -(-q // tile_q_tokens)
    req = np.repeat(np.arange(q.shape[0], dtype=np.int64), n)
    first = np.cumsum(n) - n
    j = np.arange(int(n.sum()), dtype=np.int64) - first[req]
    q0 = j * tile_q_tokens
    q1 = np.minimum(q0 + tile_q_tokens, q[req])
    return req, j, q0, q1


# (request, q_begin, q_end, q_lens, kv_lens) -> (kv_begin, kv_end): the KV each query tile may
# see (tiles in ``query_tiles`` order).
TileRanges = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]
]

# One constraint ``cq*q + ck*kv + c >= 0`` with ``c`` per tile.
_Cons = tuple[int, int, np.ndarray]


def tile_kv_ranges(
    analysis: MaskAnalysis,
    params: Mapping[str, object] | None = None,
    batch_tensors: Mapping[str, np.ndarray] | None = None,
) -> TileRanges | None:
    """A ``TileRanges`` of the mask, or None when every tile may see the whole KV (no mask,
    an opaque mask, or one whose bounds read a param not in ``params``): None exactly when
    ``mask_ranges.tile_range_program`` is None.

    ``params`` holds i32 param values known at plan time (others are ignored);
    ``batch_tensors`` host int64 arrays ``[batch]`` of the ``batch_size`` tensors the bounds
    read as ``t[batch]`` (one value per request, like a scalar per request)."""
    bounds = plan_time_bounds(analysis, params, batch_tensors)
    if bounds is None:
        return None
    known, per_req, terms = bounds

    def ranges(
        req: np.ndarray, q0: np.ndarray, q1: np.ndarray, q_lens: np.ndarray, kv_lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        kv = kv_lens[req]
        found = [_conjunction_range(t, req, q0, q1, q_lens, kv_lens, known, per_req) for t in terms]
        begin, end = found[0]
        live = begin < end
        for b, e in found[1:]:
            now = b < e
            begin = np.where(live & now, np.minimum(begin, b), np.where(now, b, begin))
            end = np.where(live & now, np.maximum(end, e), np.where(now, e, end))
            live = live | now
        begin = np.where(live & (kv > 0), begin, 0)
        end = np.where(live & (kv > 0), end, 0)
        wrapping = _may_wrap(analysis, q_lens, kv_lens, known, per_req)[req]  # as the kernel
        return np.where(wrapping, 0, begin), np.where(wrapping, kv, end)

    return ranges


def decode_spans(
    ranges: TileRanges, kv_lens: np.ndarray, q_len: int, kv_tile: int
) -> tuple[np.ndarray, np.ndarray]:
    """(offset, length) int64 [batch] of the KV each decode request's chunks cover: the KV
    range its ``q_len`` queries may see (``ranges``), clipped to the request, its start rounded
    down to a KV tile. What the decode planner is given as ``kv_offset`` / ``plan_lens``."""
    kv = np.asarray(kv_lens, dtype=np.int64)
    every = np.arange(kv.shape[0], dtype=np.int64)
    q_all = np.full(kv.shape[0], q_len, dtype=np.int64)
    begin, end = ranges(every, np.zeros_like(every), q_all, q_all, kv)
    offset = np.clip(np.asarray(begin, dtype=np.int64), 0, kv) // kv_tile * kv_tile
    return offset, np.maximum(np.clip(np.asarray(end, dtype=np.int64), 0, kv) - offset, 0)


def _may_wrap(
    analysis: MaskAnalysis,
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    params: Mapping[str, int],
    per_req: Mapping[str, np.ndarray],
) -> np.ndarray:
    """bool [batch]: whether a wrap guard of the mask may leave the i32 range in a request
    (``attnc.compiler.mask_analysis.wraps`` for every request at once)."""
    out = np.zeros(np.shape(kv_lens), dtype=bool)
    q_top = np.maximum(np.asarray(q_lens, dtype=np.int64) - 1, 0)
    k_top = np.maximum(np.asarray(kv_lens, dtype=np.int64) - 1, 0)
    for g in analysis.wrap_guards:
        c = constants_per_request(g, q_lens, kv_lens, params, per_req)
        low = c + min(g.cq, 0) * q_top + min(g.ck, 0) * k_top
        high = c + max(g.cq, 0) * q_top + max(g.ck, 0) * k_top
        out |= (low < -(2**31)) | (high > 2**31 - 1)
    return out


def _conjunction_range(
    cons: Conjunction,
    req: np.ndarray,
    q0: np.ndarray,
    q1: np.ndarray,
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    params: Mapping[str, int],
    per_req: Mapping[str, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Half-open KV range of one conjunction for every tile ``[q0, q1)`` of request ``req``."""
    cs = [constants_per_request(x, q_lens, kv_lens, params, per_req) for x in cons]
    values: list[_Cons] = [(x.cq, x.ck, c[req]) for x, c in zip(cons, cs, strict=True)]
    lo, hi = mask_tiles.project_kv(
        values, q0, q1 - 1, np.zeros_like(q0), kv_lens[req] - 1, bound=array_bound
    )
    ok = lo <= hi
    return np.where(ok, lo, 0), np.where(ok, hi + 1, 0)


def array_bound(
    a: int, c: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Intersect ``[lo, hi]`` with the integer solutions of ``a*k + c >= 0`` (numpy arrays:
    the ``bound`` that ``mask_tiles.project_kv`` takes for a whole batch)."""
    if a > 0:
        return np.maximum(lo, -((c) // a)), hi
    if a < 0:
        return lo, np.minimum(hi, c // -a)
    ok = c >= 0
    return np.where(ok, lo, np.maximum(lo, 1)), np.where(ok, hi, np.minimum(hi, 0))
