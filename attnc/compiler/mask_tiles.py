"""Tile questions on an analysed mask, evaluated in Python: the KV range a query range may
see. ``env`` holds the request's lengths and i32 params (and ``batch`` when a bound reads a
per-request tensor, whose values ``tensors`` holds). The generated C++ (``attnc/mask_math.cuh``,
emitted by ``attnc.codegen.mask_cuda``) computes the same; tests compare both with brute force
(the class of a tile has its Python reference in tests/tile_class_oracle.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnc.compiler.mask_analysis import Conjunction, MaskAnalysis, wraps


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _bound(a: int, c: int, lo: int, hi: int) -> tuple[int, int]:
    """Intersect ``[lo, hi]`` with the integer solutions of ``a*k + c >= 0``."""
    if a > 0:
        return max(lo, _ceil_div(-c, a)), hi
    if a < 0:
        return lo, min(hi, c // -a)
    return (lo, hi) if c >= 0 else (max(lo, 1), min(hi, 0))


def project_kv(
    cons: Sequence[tuple[int, int, Any]],
    q_lo: Any,
    q_hi: Any,
    lo: Any,
    hi: Any,
    bound: Callable[[int, Any, Any, Any], tuple[Any, Any]] = _bound,
) -> tuple[Any, Any]:
    """Narrow ``[lo, hi]`` to kv values some real q in ``[q_lo, q_hi]`` allows: every lower
    bound on q (``cq > 0``, and ``q >= q_lo``) against every upper bound (``cq < 0``, and
    ``q <= q_hi``) eliminates q; constraints without q bound kv alone. Scalars with the
    default ``bound``; the runtime passes arrays (one entry per request) and a vectorised one.
    """
    lower = [(1, 0, -q_lo)] + [x for x in cons if x[0] > 0]
    upper = [(-1, 0, q_hi)] + [x for x in cons if x[0] < 0]
    for cq_l, ck_l, c_l in lower:
        for cq_u, ck_u, c_u in upper:
            a, b = cq_l, -cq_u
            lo, hi = bound(a * ck_u + b * ck_l, a * c_u + b * c_l, lo, hi)
    for cq, ck, c in cons:
        if cq == 0:
            lo, hi = bound(ck, c, lo, hi)
    return lo, hi


def _project(
    cons: list[tuple[int, int, int]], q_lo: int, q_hi: int, lo: int, hi: int
) -> tuple[int, int]:
    """:func:`project_kv` of one query range; an empty one allows no kv."""
    if q_lo > q_hi:
        return 1, 0
    lo, hi = project_kv(cons, q_lo, q_hi, lo, hi)
    return int(lo), int(hi)


Tensors = Mapping[str, Any] | None


def _may_wrap(analysis: MaskAnalysis, env: Mapping[str, int], tensors: Tensors = None) -> bool:
    """Whether the mask's i32 arithmetic may wrap in this request (then it is opaque)."""
    return any(wraps(g, env, tensors) for g in analysis.wrap_guards)


def _values(
    cons: Conjunction, env: Mapping[str, int], tensors: Tensors = None
) -> list[tuple[int, int, int]]:
    return [(x.cq, x.ck, x.c_value(env, tensors)) for x in cons]


def kv_range(
    analysis: MaskAnalysis,
    q_begin: int,
    q_end: int,
    env: Mapping[str, int],
    tensors: Tensors = None,
) -> tuple[int, int]:
    """Half-open kv range any query of ``[q_begin, q_end)`` may see, clipped to
    ``[0, kv_len)``; ``(0, 0)`` when empty."""
    kv_len = int(env["kv_len"])
    if _may_wrap(analysis, env, tensors):
        return (0, kv_len) if q_begin < q_end and kv_len > 0 else (0, 0)
    if analysis.kind == "linear":
        cons = _values(analysis.constraints, env, tensors)
        return _linear_kv_range(cons, q_begin, q_end, kv_len)
    if analysis.kind == "union":
        ranges = [
            _linear_kv_range(_values(t, env, tensors), q_begin, q_end, kv_len)
            for t in analysis.terms
        ]
        live = [r for r in ranges if r[0] < r[1]]
        if not live:
            return (0, 0)
        return min(r[0] for r in live), max(r[1] for r in live)
    return (0, kv_len) if q_begin < q_end and kv_len > 0 else (0, 0)


def _linear_kv_range(
    cons: list[tuple[int, int, int]], q_begin: int, q_end: int, kv_len: int
) -> tuple[int, int]:
    lo, hi = _project(cons, q_begin, q_end - 1, 0, kv_len - 1)
    return (lo, hi + 1) if lo <= hi else (0, 0)
