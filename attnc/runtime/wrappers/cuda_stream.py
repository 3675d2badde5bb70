"""Owns: the current CUDA stream of a device as the integer handle the modules' launchers and
the tile-map step take (``torch._C._cuda_getCurrentRawStream`` where torch has it: no Stream
object is made per launch)."""

from __future__ import annotations

import torch

GET_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(device: torch.device) -> int:
    """The current CUDA stream of ``device`` (without an index: the current device) as an
    integer handle."""
    if GET_RAW_STREAM is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(GET_RAW_STREAM(index))
    return int(torch.cuda.current_stream(device).cuda_stream)
