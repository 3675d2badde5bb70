"""Owns: how a scalar param value stands in the runtime's cache keys (call memos, plan
memos, the derived-value check): by type and value, and for a float its sign too. ``0.0 ==
-0.0`` and both hash alike, but they are not interchangeable (``1.0 / t`` is ``inf`` or
``-inf``), so a key by value alone let a call with one launch the struct, or pass the check,
remembered for the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def value_key(value: object) -> tuple[object, ...]:
    """``(type, value)``, with the sign of a float, Python's, a subclass's or numpy's
    (``-0.0`` and ``0.0`` differ)."""
    if isinstance(value, float | np.floating):
        return (type(value), value, math.copysign(1.0, float(value)))
    return (type(value), value)


def same_number(a: object, b: object) -> bool:
    """``a == b`` for the scalars ``run()`` must give as ``plan()`` was given them (``1`` and
    ``1.0`` alike), but for zeros of two signs; NaN equals NaN (the same value given again)."""
    if a == b:
        return a != 0 or _sign(a) == _sign(b)
    return _is_nan(a) and _is_nan(b)


def same_values(a: Mapping[str, object], b: Mapping[str, object]) -> bool:
    """Two sets of named scalars alike, value by value (``same_number``)."""
    return a.keys() == b.keys() and all(same_number(a[k], b[k]) for k in a)


def _sign(x: object) -> float:
    return math.copysign(1.0, float(x)) if isinstance(x, float | np.floating) else 1.0


def _is_nan(x: object) -> bool:
    return isinstance(x, float | np.floating) and x != x
