"""The attention custom ops trace through their shared fake: O shaped (and laid out) like q,
an fp32 LSE [tokens, heads] only when asked for."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from attnc.runtime.wrappers.decode_op import decode_op
from attnc.runtime.wrappers.prefill_launch import prefill_op
from attnc.runtime.wrappers.single_prefill import single_prefill_op


def _qkv(mode: FakeTensorMode) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with mode:
        q = torch.empty(4, 2, 8, dtype=torch.float16).transpose(0, 1).contiguous().transpose(0, 1)
        k = torch.empty(5, 2, 8, dtype=torch.float16)
        return q, k, k


def test_decode_and_single_prefill_fakes_follow_q() -> None:
    mode = FakeTensorMode()
    q, k, v = _qkv(mode)
    with mode:
        for o, lse in (
            decode_op(1, q, k, v, [], [], [], True),
            single_prefill_op(1, q, k, v, None, [], [], [], True),
        ):
            assert o.shape == q.shape and o.dtype == q.dtype and o.stride() == q.stride()
            assert lse.shape == (4, 2) and lse.dtype == torch.float32
        _, lse = decode_op(1, q, k, v, [], [], [], False)
        assert lse.shape == (0,)


def test_prefill_fake_gives_row_major_o() -> None:
    mode = FakeTensorMode()
    q, k, v = _qkv(mode)
    with mode:
        ws = torch.empty(16, dtype=torch.uint8)
        o, lse = prefill_op(1, "m", q, k, v, ws, [0], 1.0, [], [], [], False)
        assert o.shape == q.shape and o.is_contiguous() and not q.is_contiguous()
        assert lse.shape == (0,)
