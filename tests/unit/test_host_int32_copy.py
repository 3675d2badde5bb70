"""checks.tensors.host_int32_copy: the contiguous CPU int32 copy of an index tensor that plan()
checks and plans, in memory the caller's tensor does not share, as a plain tensor."""

from __future__ import annotations

import torch

from attnc.runtime.checks import tensors

I32 = {"dtype": torch.int32}


class _Subclass(torch.Tensor):
    """A tensor subclass: its methods run its ``__torch_function__``."""


def _values_after_write(t: torch.Tensor, base: torch.Tensor) -> tuple[list[int], type]:
    host = tensors.host_int32_copy("kv_indptr", t)
    base.fill_(99)  # the caller writes after the check
    return host.tolist(), type(host)


def test_a_plain_tensor_is_copied():
    t = torch.tensor([0, 2, 5], **I32)
    assert _values_after_write(t, t) == ([0, 2, 5], torch.Tensor)


def test_views_and_subclasses_are_copied():
    base = torch.tensor([0, 7, 2, 7, 5], **I32)
    assert _values_after_write(base[::2], base) == ([0, 2, 5], torch.Tensor)
    base = torch.tensor([0, -2, -5], **I32)
    assert _values_after_write(base._neg_view(), base) == ([0, 2, 5], torch.Tensor)
    base = torch.tensor([0, 2, 5], **I32)
    assert _values_after_write(base.as_subclass(_Subclass), base) == ([0, 2, 5], torch.Tensor)
