"""Owns: the small value types of the decode ``plan()``: its unchecked arguments
(``PlanInputs``), what a plan fixes about the launch (``DecodeShape``), what the fast path
reuses from the last checked plan (``FastPathKey``, ``scalar_key``) and where the fast path
takes page ids from (``ids_placement``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.value_keys import value_key


class PlanInputs(NamedTuple):
    """``plan()``'s arguments as the caller gave them (not yet checked)."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_len: int
    sm_scale: float | None
    dtype: torch.dtype


class FastPathKey:
    """What ``plan()``'s fast path reuses from the last fully checked plan: its scalar
    arguments (``key``), the query tokens per request they give (``q_len``) and the range
    rows of the mask's plan-time params (``program``: None without; the planner holds them
    and their span table). The fast path matches ``program`` by identity: the same planned
    mask gives the same rows object."""

    __slots__ = ("key", "program", "q_len")

    def __init__(self, key: tuple[object, ...], q_len: int, program: RangeProgram | None) -> None:
        self.key = key
        self.q_len = q_len
        self.program = program


def ids_placement(kv_indices: torch.Tensor, device_index: int) -> bool | None:
    """Where the fast path takes page ids from: True on the workspace's device, False on the
    host, None elsewhere (the checked path then says why)."""
    if kv_indices.is_cuda:
        return True if kv_indices.get_device() == device_index else None
    return False if kv_indices.is_cpu else None


def scalar_key(params: Mapping[str, object]) -> tuple[tuple[object, ...], ...] | None:
    """``params`` as (name, ``value_key``) when every value is a Python int, float or bool
    (equal keys pass the same checks); None otherwise."""
    key = []
    for name, value in params.items():
        kind = type(value)
        if kind is not int and kind is not float and kind is not bool:
            return None
        key.append((name, *value_key(value)))
    return tuple(key)


@dataclass(frozen=True)
class DecodeShape:
    """What a plan fixes about the launch (must not change under CUDA graphs)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_len: int
    dtype: torch.dtype
    sm_scale: float
    rows_per_item: int
    num_ctas: int
