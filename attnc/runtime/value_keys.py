"""Owns: how a scalar param value stands in the runtime's cache keys (call memos, plan
memos, the derived-value check): by type and value, and for a float its sign too. ``0.0 ==
-0.0`` and both hash alike, but they are not interchangeable (``1.0 / t`` is ``inf`` or
``-inf``), so a key by value alone let a call with one launch the struct, or pass the check,
remembered for the other.
"""

from __future__ import annotations

import math


def value_key(value: object) -> tuple[object, ...]:
    """``(type, value)``, with the sign of a float (``-0.0`` and ``0.0`` differ)."""
    if type(value) is float:
        return (float, value, math.copysign(1.0, value))
    return (type(value), value)
