"""What every benchmarked system provides: prepare inputs once, then a timed callable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def _identity(x):
    return x


@dataclass
class Prepared:
    """``run()`` is timed; ``canon(run())`` gives the output in the shared layout to compare.

    ``timed_ms``: the median time of one call, already measured elsewhere (a child process);
    ``run()`` then only hands back the output. ``retime``: with ``timed_ms``, times the row
    again where it was measured and returns the new median ms and the timing's own note (not
    ``note``, which the outcome shows once), so such a system takes part in every timing round
    (None: timed once). ``compare=False``: the output computes another function than the
    row's (a stand-in timed for reference) and is not cross-checked.
    """

    run: Callable
    canon: Callable = field(default=_identity)
    note: str = ""
    timed_ms: float | None = None
    compare: bool = True
    retime: Callable[[], tuple[float, str]] | None = None


class System:
    """A benchmarked implementation. Subclasses set ``name`` and implement ``prepare``."""

    name = "system"
    is_attnc = False
    graph = False
    # True: the system prepares, checks and times the row itself in one call (on input set 0
    # only, in a child process); its Prepared carries ``timed_ms``.
    timed_elsewhere = False

    def prepare(self, case, data) -> Prepared:
        """Build what the timed call needs (wrappers, plans, layouts) for one input set."""
        raise NotImplementedError


def workspace(nbytes: int = 256 << 20):
    """A fresh uint8 workspace on the GPU (one per wrapper: plans may live in it)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


class NotRun(System):
    """A system left out by default: every row shows it as ``missing: <why>``."""

    def __init__(self, name: str, why: str):
        self.name = name
        self.why = why

    def prepare(self, case, data) -> Prepared:
        """Always raises Missing."""
        from benchmarks.outcome import Missing

        raise Missing(self.why)
