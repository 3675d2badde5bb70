"""Owns: :class:`Located`, the base of every AST and IR node dataclass.

It holds the node's source location as a keyword-only field that takes no part in equality,
hashing or ``repr``, so structurally equal nodes compare equal wherever they were written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnc.dsl.errors import NO_LOC, Loc


@dataclass(frozen=True)
class Located:
    """A frozen node with a source location (``loc=``, keyword-only, ignored by ``==``)."""

    loc: Loc = field(default=NO_LOC, compare=False, repr=False, kw_only=True)
