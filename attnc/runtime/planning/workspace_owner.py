"""Owns: which plan a workspace holds. A wrapper's ``plan()`` writes its work lists (and a
prefill tile map) into the workspace it was given, and ``run()`` reads them there: two
wrappers given one workspace tensor (FlashInfer's wrappers may share theirs) would silently
launch on each other's lists. ``plan()`` takes the workspace with the wrapper's token when it
writes it (not when it is refused before); ``run()`` raises when the workspace's last plan is
another wrapper's.

Workspaces are told apart by device and byte range: a plan written into a workspace takes
it from every other wrapper whose workspace overlaps it (two slices of one buffer that share
bytes count as one workspace; disjoint slices as two). Compiled graphs and CUDA-graph
replays do not check.

A wrapper cannot be copied (``copy.copy``, ``copy.deepcopy``, ``pickle``): a shallow copy
held the original's token and workspace, so the copy's ``plan()`` rewrote the lists the
original's ``run()`` then launched on, unchecked; a deep copy failed on its ctypes structs.
"""

from __future__ import annotations

import weakref
from typing import NoReturn, SupportsIndex

import torch

# (device type, device index or -1, first byte, one past the last byte)
WorkspaceKey = tuple[str, int, int, int]


class PlanToken:
    """A wrapper's claim on its workspace; the wrapper holds it, the registry only weakly."""

    __slots__ = ("__weakref__",)


# The token of the last plan written into each workspace; an entry goes with the last
# wrapper holding its token (dict operations hold the GIL). No two entries' ranges overlap
# on one device: a plan written into a range removes the entries it overlaps.
_LAST_PLAN: weakref.WeakValueDictionary[WorkspaceKey, PlanToken] = weakref.WeakValueDictionary()


class RefusesCopies:
    """A base of the wrappers: ``copy.copy``, ``copy.deepcopy`` and ``pickle`` raise
    ``TypeError`` (a wrapper's plan lives in its workspace, which a copy would share)."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        name = type(self).__name__
        raise TypeError(
            f"{name} cannot be copied or pickled: its plan lives in its workspace_buffer, "
            f"which a copy would share; create another {name} (with a workspace of its own) "
            "and plan() it"
        )


def workspace_key(workspace: torch.Tensor, byte_range: tuple[int, int]) -> WorkspaceKey:
    """The workspace's device and the bytes ``[first, one past the last)`` it spans, fixed
    for a wrapper's lifetime."""
    device = workspace.device
    return device.type, -1 if device.index is None else device.index, *byte_range


def _overlaps(a: WorkspaceKey, b: WorkspaceKey) -> bool:
    return a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3]


def take(key: WorkspaceKey, token: PlanToken | None) -> PlanToken:
    """Record that a plan of the wrapper holding ``token`` (None: its first) is written into
    the workspace ``key``; the token, which the wrapper keeps. One token serves all of a
    wrapper's plans (another wrapper's plan in between replaces it), and a workspace whose
    last plan is the wrapper's own costs one lookup."""
    if token is None:
        token = PlanToken()
    if _LAST_PLAN.get(key) is not token:
        # Another plan was written here since (or none yet): the workspaces it overlaps are
        # no longer their planners'. Entries never overlap, so a workspace whose entry is
        # still its own overlaps no other.
        for other in [k for k in list(_LAST_PLAN.keys()) if k != key and _overlaps(k, key)]:
            _LAST_PLAN.pop(other, None)
        _LAST_PLAN[key] = token
    return token


def check_held(key: WorkspaceKey, token: PlanToken | None, wrapper: str) -> None:
    """``RuntimeError`` when another plan was written into the workspace after ``token``'s
    (None: the wrapper has no workspace to check)."""
    if token is None:
        return
    if _LAST_PLAN.get(key) is not token:
        raise RuntimeError(
            f"{wrapper}.run(): workspace_buffer: another wrapper's plan() wrote its work lists "
            "into this workspace after this wrapper's plan(); give each wrapper a workspace of "
            "its own, or plan() this wrapper again before run()"
        )
