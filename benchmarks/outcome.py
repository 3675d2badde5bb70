"""The result of one system on one row: a figure, or why there is none."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class Unsupported(Exception):
    """The system cannot express this row (shown as a dash)."""


class Missing(Exception):
    """The system is not installed or not implemented (shown as "missing: reason")."""


class Failed(Exception):
    """The system failed elsewhere (a child process); the message is already the reason."""


@dataclass
class Outcome:
    """status: ok | missing | error | mismatch | n/a; value in the row's unit when ok.

    ``stand_in``: the figure is of another function than the row's (``Prepared.compare`` is
    False: timed for reference, its output not compared); the report compares no ratio with it.
    ``decoy_pull``: where the output lies from the row's eager reference (0) to its decoy (1,
    the variant without its score transform; ``decoy.py``); None where not checked.
    """

    status: str
    value: float | None = None
    note: str = ""
    rel_err: float | None = None
    stand_in: bool = False
    decoy_pull: float | None = None

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def short_reason(exc: BaseException, limit: int = 90) -> str:
    """First line of an exception message, with its type, cut to ``limit`` characters."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    msg = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def from_exception(exc: BaseException) -> Outcome:
    """Map an exception raised while preparing or running a system to an Outcome."""
    if isinstance(exc, Unsupported):
        return Outcome("n/a", note=str(exc))
    if isinstance(exc, Missing):
        return Outcome("missing", note=str(exc))
    if isinstance(exc, Failed):
        return Outcome("error", note=str(exc))
    return Outcome("error", note=short_reason(exc))
