"""Owns: which parts of a variant's score and mask depend on the key alone, for kernels that
compute them once per key instead of once per element.

A sub-expression whose leaves are ``kv_idx``, request values, scalar params, constants and
tensor reads (``t[kv_idx]``, ``doc[kv_idx]``, ``log(1.0 + t[kv_idx]) * 0.5``) is the same for
every query row at a key. :func:`key_reads` lists the tensor reads among them (the Hopper
producer prefetches those into L1); :func:`key_terms` the largest such sub-expressions that
read a tensor (``V::KeyValues``: the Hopper producer computes them per key and tile, and the
consumers' ``*_at`` hooks take them instead of reading and computing per element).
"""

from __future__ import annotations

from attnc.compiler import ir

MAX_KEY_READS = 8
"""Tensor reads a kernel touches per key at most (none past that)."""

MAX_KEY_TERMS = 8
"""Values a kernel computes per key at most (none past that)."""


def key_reads(v: ir.VariantIR) -> tuple[ir.TensorLoad, ...]:
    """The distinct tensor reads of the score and mask whose indices use ``kv_idx`` and no
    row value (``t[kv_idx]``, ``doc[kv_idx]``, ``t[perm[kv_idx] % 8]``): the same for every
    query row, so a kernel can read them per key ahead of the scores (at most
    ``MAX_KEY_READS``; none past that)."""
    found: dict[ir.TensorLoad, None] = {}
    for e in (v.score, v.mask):
        if e is None:
            continue
        for n in ir.walk(e):
            if isinstance(n, ir.TensorLoad) and _by_key_alone(n):
                found[n] = None
    return tuple(found) if len(found) <= MAX_KEY_READS else ()


def key_terms(forms: list[ir.Expr]) -> tuple[ir.Expr, ...]:
    """The largest sub-expressions of ``forms`` (the expressions a kernel evaluates per
    element: the mask and one form of the score) that depend on the key alone and read a
    tensor at an index built from ``kv_idx``, distinct, in the order met (at most
    ``MAX_KEY_TERMS``; none past that). A term of the score therefore makes the score read by
    key (the functor's ``kScoreReadsByKey``, by which kernels decide which tiles need the
    values); one whose reads do not involve the key (``kv_idx < prefix[batch]``) is not a term:
    its read is a request value, hoisted once per request. A term may sit under a guard:
    kernels compute it for every key, with its reads bounds-checked where no guard is needed
    to keep them inside."""
    found: dict[ir.Expr, None] = {}
    for e in forms:
        for node in ir.walk(e, below=lambda n: not _is_term(n)):
            if _is_term(node):
                found.setdefault(node)
    return tuple(found) if len(found) <= MAX_KEY_TERMS else ()


def _is_term(e: ir.Expr) -> bool:
    reads_by_key, depends = _summary(e)
    return reads_by_key and depends == _KEY


def _by_key_alone(e: ir.Expr) -> bool:
    """``kv_idx`` in ``e``, and otherwise request values only (no head, row or score: every
    query row has the same value at a key)."""
    return _summary(e)[1] == _KEY


# What a node depends on, remembered per node: (reads a tensor at an index that depends on
# kv_idx, _KEY / _REQUEST / _OTHER: what its value depends on at most).
_REQUEST, _KEY, _OTHER = 0, 1, 2


def _summary(e: ir.Expr) -> tuple[bool, int]:
    return ir.bottom_up(e, "_key_summary", _own_summary)


def _own_summary(e: ir.Expr) -> tuple[bool, int]:
    if isinstance(e, ir.Builtin):
        if e.name == "kv_idx":
            return False, _KEY
        known = e.name in ir.BUILTINS and ir.BUILTINS[e.name][1] == ir.REQUEST
        return False, _REQUEST if known else _OTHER
    kids = [c.__dict__["_key_summary"] for c in ir.children(e)]
    depends = max([_REQUEST] + [d for _, d in kids])
    by_key = isinstance(e, ir.TensorLoad) and depends >= _KEY
    return by_key or any(r for r, _ in kids), depends
