"""``attnc::decode`` called with the handle of a wrapper that is gone (a graph that outlived
it) is a RuntimeError naming the handle, as ``attnc::single_prefill`` is for variants."""

from __future__ import annotations

import gc

import pytest
import torch

from attnc.runtime.wrappers import decode_op


class _Gone:
    """A wrapper that is registered, then dropped."""


def _call(handle: int) -> None:
    q = torch.zeros(4, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    torch.ops.attnc.decode(handle, q, k, k, [], [], [], False)


def test_unknown_handle_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"attnc::decode: wrapper handle 987654321 names no"):
        _call(987654321)


def test_handle_of_a_collected_wrapper_is_a_clear_error():
    gone = _Gone()
    handle = decode_op.register_wrapper(gone)
    del gone
    gc.collect()
    with pytest.raises(RuntimeError, match=rf"wrapper handle {handle} names no live"):
        _call(handle)
