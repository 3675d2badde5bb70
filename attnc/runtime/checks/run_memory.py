"""Owns: the memory checks of a checked ``run()`` (prefill and decode alike): the ``out``
tensor like ``q`` and apart from what the kernel reads while writing it, no tensor of the
call in the workspace, and the 16-byte vector layout of q, K, V and O."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnc.runtime.checks import tensors

Named = tuple[str, torch.Tensor]


def check_run_memory(
    q: torch.Tensor,
    kv: tuple[Named, Named],
    out: torch.Tensor | None,
    params: Sequence[Named],
    workspace: tuple[int, int],
    o_stride_multiple: int,
) -> torch.Tensor | None:
    """The checked ``out`` (None: none given) of a run over ``q`` and the named K and V
    ``kv`` with the named tensor ``params``: ``out`` like ``q`` and apart from K, V and the
    params; q, ``out``, K, V and the params outside the ``workspace`` bytes ``[start, end)``;
    q, K, V and ``out`` laid out for the kernels' vector accesses (O's strides multiples of
    ``o_stride_multiple``). A ``ValueError`` names the tensor otherwise."""
    if out is not None:
        out = tensors.check_out(out, q)
        tensors.check_apart("out", out, (*kv, *params))
    tensors.check_outside_workspace(workspace, (("q", q), ("out", out), *kv, *params))
    qkv = tensors.QKV_STRIDE_MULTIPLE
    (k_name, k), (v_name, v) = kv
    tensors.check_vector_layout(
        (("q", q, qkv), (k_name, k, qkv), (v_name, v, qkv), ("out", out, o_stride_multiple))
    )
    return out
