"""Owns: :class:`Located`, the base of every AST and IR node class.

Every subclass is made a frozen dataclass when it is defined (type checkers are told so by
``dataclass_transform``), so a node class declares only its fields. The base holds the node's
source location as a keyword-only field that takes no part in equality, hashing or ``repr``,
so structurally equal nodes compare equal wherever they were written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnc.dsl.errors import NO_LOC, Loc

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kwargs: Any):
        """At run time the marker does nothing: it only informs type checkers."""
        return lambda cls: cls


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
@dataclass(frozen=True)
class Located:
    """A frozen node with a source location (``loc=``, keyword-only, ignored by ``==``).

    A subclass must not be decorated with ``@dataclass`` itself: defining it makes it one.
    """

    loc: Loc = field(default=NO_LOC, compare=False, repr=False, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True)(cls)
