"""Owns: the stamps of planned tensors (the tensor params a plan read, which ``run()`` must
be given again, unwritten: the plan's KV ranges and tile map were computed from their values)
and attnc's own writes, which must not count as the caller's.

A stamp is the tensor object, its address and its autograd version. Views of one allocation
share one version counter, so a write into any of them moves every view's version: attnc's
own writes into an allocation (the version bump after an ``out=`` launch, ``plan()``'s copy
of its lists into the workspace) go through :func:`own_write`, which moves the stamps of
every wrapper whose planned tensor saw only that write and holds none of its bytes. A compiled
``run(out=...)`` writes ``out`` through the traced graph's own copy, which is not followed: a
planned tensor of the same allocation then counts as written. Inference tensors (made under
``torch.inference_mode``) keep no version: their stamp holds the object and address only, so a write
into one after ``plan()`` is not seen.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attnc.runtime.checks.memory import byte_range
from attnc.runtime.tracing import compiling

# Live stamps by the address of their tensor's storage (the candidates an own write into that
# storage may move; the version decides). Keys whose stamps are gone are dropped as new ones
# come.
_BY_STORAGE: dict[int, weakref.WeakSet[TensorStamp]] = {}
_LOCK = threading.Lock()
_PRUNE_AT = 64


def _storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass(eq=False)
class TensorStamp:
    """A planned tensor as ``run()`` must see it again: the object, its address and its
    version (None for an inference tensor, which keeps none). ``version`` moves on only by
    :func:`own_write`."""

    tensor: torch.Tensor
    data_ptr: int
    version: int | None

    @staticmethod
    def of(t: torch.Tensor) -> TensorStamp:
        """The stamp of ``t`` now (recorded, so that attnc's own writes can move it)."""
        if t.is_inference():
            return TensorStamp(t, t.data_ptr(), None)
        stamp = TensorStamp(t, t.data_ptr(), t._version)
        key = _storage_address(t)
        with _LOCK:
            if len(_BY_STORAGE) >= _PRUNE_AT:
                for gone in [k for k, stamps in _BY_STORAGE.items() if not stamps]:
                    del _BY_STORAGE[gone]
            _BY_STORAGE.setdefault(key, weakref.WeakSet()).add(stamp)
        return stamp

    def matches(self, value: object) -> bool:
        """True when ``value`` is the planned tensor, unchanged since ``plan()``."""
        return (
            value is self.tensor
            and isinstance(value, torch.Tensor)
            and value.data_ptr() == self.data_ptr
            and (self.version is None or value._version == self.version)
        )


def own_write(written: torch.Tensor, write: Callable[[], object]) -> None:
    """Run ``write``, attnc's own write into ``written`` (one in-place write, a version bump
    or a ``copy_``): each stamp of a tensor in the same storage, apart from ``written``'s
    bytes, whose version was its stamp's and moved by exactly that one write shares
    ``written``'s version counter, so its bytes are unchanged and it takes the new version. A
    write by another thread in between moves it by two, and a planned tensor within the span
    of ``written`` (another wrapper's ``out=`` over it: each wrapper checks only its own
    params; the span of a strided ``out`` includes its gaps) counts as written: neither is
    followed."""
    found = _BY_STORAGE.get(_storage_address(written)) if _BY_STORAGE else None
    if not found:
        write()
        return
    with _LOCK:
        stamps = list(found)
    start, end = byte_range(written)
    apart = [s for s in stamps if _apart(byte_range(s.tensor), start, end)]
    before = [stamp.tensor._version for stamp in apart]
    write()
    for stamp, version in zip(apart, before, strict=True):
        if version == stamp.version and stamp.tensor._version == version + 1:
            stamp.version = version + 1


def _apart(span: tuple[int, int], start: int, end: int) -> bool:
    """True when the bytes ``span`` share none with ``[start, end)``."""
    return span[1] <= start or end <= span[0]


def check_planned_tensors(
    variant_name: str, stamps: Mapping[str, TensorStamp], values: Mapping[str, object]
) -> None:
    """Raise a ``ValueError`` naming the param when ``run()``'s tensor is not the planned one
    (another object, other storage, or written since ``plan()``). Not checked while
    ``torch.compile`` traces (it sees stand-ins, not the caller's tensors)."""
    if not stamps or compiling():
        return
    for name, stamp in stamps.items():
        value = values.get(name)
        if stamp.matches(value):
            continue
        if value is not stamp.tensor:
            why = "another tensor object than plan()"
        elif isinstance(value, torch.Tensor) and value.data_ptr() != stamp.data_ptr:
            why = "the planned tensor object, now with other storage"
        else:
            why = "the planned tensor, written since plan()"
        raise ValueError(
            f"variant '{variant_name}': param '{name}': run() was given {why}; plan() built "
            "the work list (and tile map) from its values: call plan() again with the new "
            "values"
        )
