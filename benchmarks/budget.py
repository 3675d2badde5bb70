"""Time budgets: one total for the run, split so that every suite gets a share.

A suite's share is taken when it starts: ``weight / (sum of the weights still to run)`` of
the time left, so time a suite did not use passes on to the later ones. Inside a suite, a
row is started only while the suite's deadline has not passed and the time left is at
least half the mean duration of the rows run so far (a row that would clearly overrun is
left out, and noted, instead of eating the next suite's share).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

# Relative shares: prefill rows are the slowest (compiles, JIT builds); jit runs child
# processes that build from an empty cache.
WEIGHTS = {"prefill": 0.34, "decode": 0.16, "host": 0.08, "batch": 0.17, "jit": 0.25}


def suite_share(suite: str, remaining_suites: Sequence[str], seconds_left: float) -> float:
    """Seconds for ``suite`` out of ``seconds_left``, given the suites still to run (itself
    included)."""
    weights = [WEIGHTS.get(s, 0.1) for s in remaining_suites]
    total = sum(weights)
    if total <= 0 or seconds_left <= 0:
        return max(0.0, seconds_left)
    return seconds_left * WEIGHTS.get(suite, 0.1) / total


class SuiteClock:
    """Deadline of one suite plus the durations of the rows it ran."""

    def __init__(self, deadline: float | None, clock: Callable[[], float] = time.monotonic):
        self.deadline = deadline
        self.clock = clock
        self.durations: list[float] = []
        self._started: float | None = None

    def left(self) -> float | None:
        """Seconds left in this suite (None: no limit)."""
        return None if self.deadline is None else self.deadline - self.clock()

    def may_start(self) -> bool:
        """True if a new row fits (see the module docstring)."""
        left = self.left()
        if left is None:
            return True
        if left <= 0:
            return False
        if not self.durations:
            return True
        mean = sum(self.durations) / len(self.durations)
        return left >= 0.5 * mean

    def start(self) -> None:
        """A row starts."""
        self._started = self.clock()

    def stop(self) -> None:
        """The row started last has ended."""
        if self._started is not None:
            self.durations.append(self.clock() - self._started)
            self._started = None
