"""The KV projection of linear mask constraints has one home (compiler/mask_tiles.project_kv):
the vectorised call of the plan-time oracle (tests/mask_ranges_oracle) agrees with the scalar one
request by request, and both with brute force."""

from __future__ import annotations

import random

import numpy as np
from mask_ranges_oracle import array_bound

from attnc.compiler.mask_tiles import project_kv


def _brute(cons, q_lo, q_hi, kv_hi):
    ks = [
        k
        for k in range(kv_hi + 1)
        if any(all(cq * q + ck * k + c >= 0 for cq, ck, c in cons) for q in range(q_lo, q_hi + 1))
    ]
    return ks


def test_vectorised_projection_matches_scalar_and_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(200):
        cons = [(rng.choice((-1, 0, 1)), rng.choice((-1, 1)), rng.randint(-8, 8)) for _ in range(2)]
        n = 5
        q_lo = np.array([rng.randint(0, 6) for _ in range(n)], dtype=np.int64)
        q_hi = q_lo + np.array([rng.randint(0, 4) for _ in range(n)], dtype=np.int64)
        kv_hi = np.array([rng.randint(0, 12) for _ in range(n)], dtype=np.int64)
        arr_cons = [(cq, ck, np.full(n, c, dtype=np.int64)) for cq, ck, c in cons]
        lo, hi = project_kv(
            arr_cons, q_lo, q_hi, np.zeros(n, dtype=np.int64), kv_hi, bound=array_bound
        )
        for i in range(n):
            s_lo, s_hi = project_kv(cons, int(q_lo[i]), int(q_hi[i]), 0, int(kv_hi[i]))
            assert (int(lo[i]), int(hi[i])) == (s_lo, s_hi)
            seen = _brute(cons, int(q_lo[i]), int(q_hi[i]), int(kv_hi[i]))
            if seen:  # the projection is a superset hull: it holds every visible key
                assert s_lo <= min(seen) and max(seen) <= s_hi
