"""Both wrappers check their workspace through one function: contiguous, CUDA for decode,
viewed as flat bytes."""

from __future__ import annotations

import pytest
import torch

from attnc.runtime.checks.tensors import workspace_bytes


def test_workspace_bytes_views_flat_bytes() -> None:
    ws = torch.zeros(4, 8, dtype=torch.float32)
    out = workspace_bytes(ws)
    assert out.dtype == torch.uint8 and out.shape == (128,)
    assert out.data_ptr() == ws.data_ptr()


def test_workspace_bytes_rejects_bad_buffers() -> None:
    with pytest.raises(ValueError, match="expected a contiguous torch.Tensor"):
        workspace_bytes(torch.zeros(4, 8).t())
    with pytest.raises(ValueError, match="expected a contiguous torch.Tensor"):
        workspace_bytes([0] * 8)
    with pytest.raises(ValueError, match="must be on a cuda device, got cpu"):
        workspace_bytes(torch.zeros(8, dtype=torch.uint8), require_cuda=True)
