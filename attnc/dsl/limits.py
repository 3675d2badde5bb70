"""Owns: the size limits of the language and the recursion room the passes get.

Every limit is reported as a located error that names it. The passes walk expression DAGs;
a few of them recurse once per nesting level, so compiling runs under
:func:`deep_recursion`, which gives Python room for :data:`MAX_EXPR_DEPTH` levels.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Deepest nesting of one written expression (a flat sum of N terms nests N deep).
MAX_EXPR_DEPTH = 2000
# Deepest expression after lets and defs are substituted.
MAX_IR_DEPTH = 2000
# Longest chain of imports (a file importing one that imports another ...).
MAX_IMPORT_DEPTH = 100
# Most params of one variant. Their struct is a kernel argument, and a kernel's arguments
# are limited (32764 bytes on sm_80 and newer); 1024 params take at most 8 KB of it.
MAX_PARAMS = 1024
# Python frames the deepest pass may need per nesting level, with a margin.
_FRAMES_PER_LEVEL = 12
RECURSION_LIMIT = 1000 + _FRAMES_PER_LEVEL * max(MAX_EXPR_DEPTH, MAX_IR_DEPTH)


def too_deep_message(what: str, limit: int) -> str:
    """The message of a nesting limit."""
    return f"{what} nested too deeply (more than {limit} levels, the limit)"


@contextmanager
def deep_recursion() -> Iterator[None]:
    """Run the body with a recursion limit of at least :data:`RECURSION_LIMIT`."""
    old = sys.getrecursionlimit()
    if old >= RECURSION_LIMIT:
        yield
        return
    sys.setrecursionlimit(RECURSION_LIMIT)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)
