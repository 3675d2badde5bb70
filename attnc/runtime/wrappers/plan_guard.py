"""Owns: the rule that a wrapper makes one plan at a time. ``plan()`` runs caller code between
its checks and its work lists (a param's ``__int__``, ``sm_scale.__float__``); a ``plan()`` of
the same wrapper from there would replace the checked batch under the outer call, which
would then pack the inner batch's lists with the outer's tensor params (sized for another
batch: the kernels would read past them). Such a call is refused instead."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

_Plan = TypeVar("_Plan", bound=Callable[..., Any])


def one_plan_at_a_time(plan: _Plan) -> _Plan:
    """``plan`` (a wrapper method) raising ``RuntimeError`` when called on a wrapper whose
    ``plan()`` is still running."""

    @functools.wraps(plan)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_planning"):
            raise RuntimeError(
                f"attnc: {type(self).__name__}.plan() was called while a plan() of the same "
                "wrapper was running (from a param's or sm_scale's conversion, say): a wrapper "
                "plans one batch at a time"
            )
        self.__dict__["_planning"] = True
        try:
            return plan(self, *args, **kwargs)
        finally:
            self.__dict__["_planning"] = False

    return guarded  # type: ignore[return-value]
