"""Owns: whether the tile math of a mask analysis is exact in 64-bit integers.

The generated ``kv_range``/``classify`` (``attnc/mask_math.cuh``), the wrap check that
:mod:`attnc.codegen.mask_cuda` prints before them and the host planners' range rows compute
with ``long long`` values: the constant part ``offset + sum(coef * atom)`` of a constraint or
wrap guard, its value at a tile corner ``cq*q_idx + ck*kv_idx + c``, its extremes over a
request, and the products of two constraints that Fourier-Motzkin elimination forms
(``a*u.ck + b*l.ck`` and ``a*u.c + b*l.c``). The coefficients of a chain of lets such as
``a{i+1} = a{i} * 3 + 1`` grow without bound, so these checks bound every such computation
by the largest ``long long``; a mask that fails them is analysed as opaque.

Every atom (an i32 param, ``q_len``, ``kv_len``, a per-request tensor read, a product of
those) and every index and length is an i32 value, at most :data:`I32_SPAN` in magnitude.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

I32_SPAN = 2**31  # the largest magnitude of an i32 value
INT64_MAX = 2**63 - 1


class Form(Protocol):
    """``cq*q_idx + ck*kv_idx + sum(coef*atom) + offset`` (a constraint or a wrap guard)."""

    @property
    def cq(self) -> int:
        """The coefficient of ``q_idx``."""
        ...

    @property
    def ck(self) -> int:
        """The coefficient of ``kv_idx``."""
        ...

    @property
    def terms(self) -> Sequence[tuple[int, object]]:
        """The ``(coef, atom)`` pairs of the constant part; each atom is an i32 value."""
        ...

    @property
    def offset(self) -> int:
        """The integer constant of the constant part."""
        ...


def constant_span(form: Form) -> int:
    """A bound on the magnitude of the constant part ``offset + sum(coef*atom)`` of
    ``form`` and of each partial sum of it, for any i32 atoms."""
    return abs(form.offset) + I32_SPAN * sum(abs(c) for c, _ in form.terms)


def span(form: Form) -> int:
    """A bound on the magnitude of ``form`` and of each partial sum the generated code
    forms while computing it, for any i32 indices and atoms."""
    return constant_span(form) + I32_SPAN * (abs(form.cq) + abs(form.ck))


def form_fits(form: Form) -> bool:
    """Whether every value the generated code computes from ``form`` alone fits in int64."""
    return span(form) <= INT64_MAX


@dataclass(frozen=True)
class _Box:
    """``q_idx >= q_lo`` (``cq = 1``) or ``q_idx <= q_hi`` (``cq = -1``), the query range
    that elimination adds to a conjunction (its constant is an i32 index)."""

    cq: int
    ck: int = 0
    terms: tuple[tuple[int, object], ...] = ()
    offset: int = I32_SPAN


def _pair_fits(lower: Form, upper: Form) -> bool:
    """Whether eliminating q_idx between ``lower`` (cq > 0) and ``upper`` (cq < 0) fits."""
    a, b = abs(lower.cq), abs(upper.cq)
    ck = a * abs(upper.ck) + b * abs(lower.ck)
    c = a * constant_span(upper) + b * constant_span(lower)
    return max(ck, c) <= INT64_MAX


def conjunction_fits(cons: Sequence[Form]) -> bool:
    """Whether the tile math of one conjunction is exact in int64: every constraint alone,
    and every pair that elimination combines (the query range's bounds included)."""
    if not all(form_fits(x) for x in cons):
        return False
    lower = [_Box(1), *(x for x in cons if x.cq > 0)]
    upper = [_Box(-1), *(x for x in cons if x.cq < 0)]
    return all(_pair_fits(lo, up) for lo in lower for up in upper)


def analysis_fits(conjunctions: Iterable[Sequence[Form]], guards: Iterable[Form]) -> bool:
    """Whether the tile math of a mask with these conjunctions and wrap guards is exact in
    int64."""
    return all(form_fits(g) for g in guards) and all(conjunction_fits(t) for t in conjunctions)
