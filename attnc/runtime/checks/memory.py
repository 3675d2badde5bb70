"""Owns: what memory a tensor addresses (its byte range) and whether it has that memory: a
FakeTensor (``FakeTensorMode``), a tensor inside a ``torch.func`` transform and a subclass
that wraps other tensors (DTensor) have none of their own, and a view whose storage was
freed or shrunk addresses bytes its storage does not hold. The eager paths refuse such tensors
before a planner or kernel reads them.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from attnc.runtime.tracing import compiling


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The addresses ``[first, one past the last)`` of the bytes ``t`` can address (an
    empty range for an empty tensor)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    if t.numel() == 0:
        return start, start
    return start, start + (last_offset(t) + 1) * t.element_size()


def last_offset(t: torch.Tensor) -> int:
    """The element offset of ``t``'s last element from its first."""
    if t.is_contiguous():
        return t.numel() - 1
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def has_memory(t: torch.Tensor) -> bool:
    """False for a FakeTensor (``FakeTensorMode``: shapes without memory, a null data pointer),
    for a tensor inside a ``torch.func`` transform (vmap, grad: a wrapper without storage) and
    for a subclass that wraps other tensors (``is_wrapper``); the kernels and planners cannot
    read any of them. Cheap for ordinary tensors: the eager fast paths ask it."""
    if is_fake(t):
        return False
    if transforms_active() and torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    return type(t) is torch.Tensor or not is_wrapper(t)


def is_wrapper(t: torch.Tensor) -> bool:
    """True for a tensor subclass that wraps other tensors (``__torch_dispatch__``: DTensor,
    torch's TwoTensor): it dispatches to Python and its storage has no address (its data
    pointer reads 0). A Parameter over a sparse or zero tensor is none."""
    if not torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python):
        return False
    try:
        t.untyped_storage().data_ptr()
    except RuntimeError:
        return True
    return False


def is_fake(t: torch.Tensor) -> bool:
    """True for a FakeTensor (``FakeTensorMode``): shapes without memory."""
    return type(t) is not torch.Tensor and isinstance(t, FakeTensor)


# True inside a torch.func transform (vmap, grad), whose tensors are wrappers without storage.
transforms_active = torch._C._are_functorch_transforms_active


def check_has_memory(name: str, t: torch.Tensor) -> None:
    """Refuse, on an eager path whose kernels or planners read ``t``'s memory, a tensor
    without memory of its own (``has_memory``). Traced by ``torch.compile`` tensors are
    stand-ins, and pass; fake implementations of the custom ops do not call this."""
    if type(t) is torch.Tensor and not transforms_active():  # the common case, at once
        return
    if has_memory(t) or compiling():
        return
    if isinstance(t, FakeTensor):
        raise ValueError(
            f"{name}: a fake tensor (FakeTensorMode) has no memory for attnc to read; give a "
            "real tensor (under torch.compile the custom ops take fake ones)"
        )
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        raise ValueError(
            f"{name}: a tensor inside a torch.func transform (vmap, grad); attnc's kernels "
            "neither batch nor differentiate: call them outside the transform"
        )
    raise ValueError(
        f"{name}: a {type(t).__name__}, a tensor subclass that wraps other tensors, has no "
        "memory of its own for attnc to read; give a plain tensor"
    )


def check_storage_holds(name: str, t: torch.Tensor) -> None:
    """Refuse a view whose storage does not hold the bytes it addresses: a storage freed by
    ``untyped_storage().resize_(0)`` (as sharded training frees parameters) leaves the view's
    shape and a null or dangling address, which a kernel or planner would read. Traced by
    ``torch.compile`` tensors are stand-ins, and pass."""
    if compiling() or storage_holds(t):
        return
    held = 0 if t._is_zerotensor() else t.untyped_storage().nbytes()
    raise ValueError(
        f"{name}: its storage holds {held} bytes, fewer than the view addresses (a storage "
        "freed by untyped_storage().resize_(0), say); give a tensor with its memory"
    )


def storage_holds(t: torch.Tensor) -> bool:
    """True when ``t``'s storage holds every byte ``t`` addresses (an empty tensor holds
    none); a fraction of a microsecond for a contiguous one."""
    numel = t.numel()
    if numel == 0:
        return True
    storage = t.untyped_storage()
    try:
        base = storage.data_ptr()
    except RuntimeError:  # no storage to point into (torch's zero tensors)
        return False
    if base == 0:
        return False
    if t.is_contiguous():
        return (t.storage_offset() + numel) * t.element_size() <= storage.nbytes()
    start, end = byte_range(t)
    return base <= start and end <= base + storage.nbytes()
