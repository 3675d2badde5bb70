"""Owns: the rule that a wrapper's plan does not change under a call that is using it.
``plan()`` and ``run()`` run caller code between their checks and what they launch or pack (a
param's ``__int__``, ``sm_scale.__float__``, a key's ``__hash__``); a ``plan()`` of the same
wrapper from there would replace the checked batch under the outer call: a ``plan()`` would
pack the inner batch's lists with the outer's tensor params, a ``run()`` would launch the new
plan over tensors checked against the old one (the kernels would read and write past them).
A ``plan()`` inside ``plan()`` is refused; ``run()`` compares ``plans_begun`` before its
launch with the count it read first, and checks again that its plan is the workspace's last,
and launches nothing when a ``plan()`` began meanwhile or another wrapper's plan took the
workspace (eager calls: a traced ``run()`` reads no count, which would recompile it at every
plan)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from attnc.runtime.planning import workspace_owner

_Plan = TypeVar("_Plan", bound=Callable[..., Any])


def one_plan_at_a_time(plan: _Plan) -> _Plan:
    """``plan`` (a method of a wrapper class with class attributes ``_plans_begun = 0`` and
    ``_planning = False``) counting its calls in the wrapper's ``_plans_begun``, and raising
    ``RuntimeError`` when called on a wrapper whose ``plan()`` is still running."""

    @functools.wraps(plan)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._planning:
            raise RuntimeError(
                f"attnc: {type(self).__name__}.plan() was called while a plan() of the same "
                "wrapper was running (from a param's or sm_scale's conversion, say): a wrapper "
                "plans one batch at a time"
            )
        self._planning = True
        self._plans_begun += 1
        try:
            return plan(self, *args, **kwargs)
        finally:
            self._planning = False

    return guarded  # type: ignore[return-value]


def check_not_replanned(wrapper: Any, begun: int, name: str) -> None:
    """Raise ``RuntimeError`` when a ``plan()`` of ``wrapper`` (a ``name``) began since its
    ``_plans_begun`` was ``begun`` (read at the start of its ``run()``, which then launches
    nothing), or another wrapper's plan was written into its workspace since its own
    (``workspace_owner.check_held``: a plan of a wrapper sharing the workspace, made by
    caller code during the call)."""
    if wrapper._plans_begun != begun:
        raise RuntimeError(
            f"attnc: {name}.run(): plan() of the same wrapper was called during this call "
            "(from a param's conversion, say); nothing was launched"
        )
    workspace_owner.check_held(wrapper._workspace_key, wrapper._plan_token, name)
