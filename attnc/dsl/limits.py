"""Owns: the size limits of the language (its i32 range, and the longest request its sizes
describe) and the recursion room the passes get.

Every limit is reported as a located error that names it. The passes walk expression DAGs;
a few of them recurse once per nesting level, so compiling runs under
:func:`deep_recursion`, which gives Python room for :data:`MAX_EXPR_DEPTH` levels.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The i32 range: the language's integers, and the 32-bit indices and counts of the kernels.
I32_MIN = -(2**31)
I32_MAX = 2**31 - 1
# Deepest nesting of one written expression (a flat sum of N terms nests N deep).
MAX_EXPR_DEPTH = 2000
# Deepest expression after lets and defs are substituted.
MAX_IR_DEPTH = 2000
# Longest chain of imports (a file importing one that imports another ...).
MAX_IMPORT_DEPTH = 100
# Largest .attn file read (the stdlib's are a few KB; the caches cap what they read too).
MAX_SOURCE_BYTES = 16 << 20
# Most params of one variant. Their struct is a kernel argument, and a kernel's arguments
# are limited (32764 bytes on sm_80 and newer); 1024 params take at most 8 KB of it.
MAX_PARAMS = 1024
# Most KV tokens of one request: int32 less a margin for the kernels' tile arithmetic (tiles
# of at most 256 keys step by kv0 + tile). The runtime refuses a longer request
# (runtime/checks/limits.py; the host planners' kMaxRequestTokens in page_table_check.h is the
# same number), so the index check may take kv_idx + c (c < 2**16) as free of wrap-around.
MAX_KV_TOKENS = 2**31 - 2**16
# Most query tokens of one request, the same margin for the query tiles (q0 + tile): with
# both limits q_pos = kv_len - q_len + q_idx is above -2**31 + 2**16, so q_pos - 7 cannot wrap.
MAX_QUERY_TOKENS = 2**31 - 2**16
# Python frames the deepest pass may need per nesting level, with a margin.
_FRAMES_PER_LEVEL = 12
RECURSION_LIMIT = 1000 + _FRAMES_PER_LEVEL * max(MAX_EXPR_DEPTH, MAX_IR_DEPTH)


def too_deep_message(what: str, limit: int) -> str:
    """The message of a nesting limit."""
    return f"{what} nested too deeply (more than {limit} levels, the limit)"


class _RecursionRoom:
    """The raised recursion limit, shared by every thread inside :func:`deep_recursion`.

    The limit is one value for the whole interpreter: it is raised when the first thread
    enters and restored when the last one leaves, never while another compilation is deep
    inside its passes (restoring it then gave that one a ``RecursionError``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.restore_to: int | None = None

    def enter(self) -> None:
        """One more holder; the first raises the limit when it is below RECURSION_LIMIT."""
        with self.lock:
            if self.holders == 0:
                old = sys.getrecursionlimit()
                self.restore_to = old if old < RECURSION_LIMIT else None
                if self.restore_to is not None:
                    sys.setrecursionlimit(RECURSION_LIMIT)
            self.holders += 1

    def leave(self) -> None:
        """One holder less; the last restores the limit it found."""
        with self.lock:
            self.holders -= 1
            if self.holders == 0 and self.restore_to is not None:
                sys.setrecursionlimit(self.restore_to)
                self.restore_to = None


_ROOM = _RecursionRoom()


@contextmanager
def deep_recursion() -> Iterator[None]:
    """Run the body with a recursion limit of at least :data:`RECURSION_LIMIT` (safe to use
    from several threads at once, and nested)."""
    _ROOM.enter()
    try:
        yield
    finally:
        _ROOM.leave()
