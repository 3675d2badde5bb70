"""Time budgets: one total for the run, split so that every suite gets a share.

A suite's share is taken when it starts: ``weight / (sum of the weights still to run)`` of
the time left, so time a suite did not use passes on to the later ones. Inside a suite, a
row is started only while the suite's deadline has not passed and the time left is at
least half the mean duration of the rows run so far (a row that would clearly overrun is
left out, and noted, instead of eating the next suite's share).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

# Relative shares: prefill rows are the slowest (compiles, FlashInfer FA3 JIT builds, the
# FA4 child's compiles, two attnc templates); jit runs child processes that build from an
# empty cache.
WEIGHTS = {"prefill": 0.40, "decode": 0.15, "host": 0.07, "batch": 0.16, "jit": 0.22}
# FlashInfer FA3 builds each module (kernel kind, head_dim, soft-cap/window/ALiBi flags) with
# nvcc on first use: ~50 s on a 16-core host (ANCHORS.md: 48-53 s). FlashInfer keeps built
# modules on disk, so a later call on the same machine loads them in a second or two:
# ATTNC_FA3_BUILD_S (e.g. 5) then says so.
FA3_BUILD_S = float(os.environ.get("ATTNC_FA3_BUILD_S", "") or 50.0)


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


class JitBuilds:
    """The JIT modules one system has started to build in this process.

    ``admit(key, left)`` lets a call go ahead when its module was built before, when there is
    no time limit, or when the suite's time left covers the build (``build_s``) with 20% to
    spare; otherwise it raises Missing, so one slow build does not eat the rows after it.
    """

    def __init__(self, build_s: float, what: str):
        self.build_s = build_s
        self.what = what
        self.seen: set = set()

    def admit(self, key, left: float | None) -> None:
        """Go ahead (and remember ``key``) or raise Missing with the reason."""
        from benchmarks.outcome import Missing

        if key in self.seen or left is None or left >= 1.2 * self.build_s:
            self.seen.add(key)
            return
        raise Missing(
            f"{self.what} not built: its JIT build (~{self.build_s:.0f} s) does not fit the "
            f"{max(0.0, left):.0f} s left in the suite"
        )
