"""Owns: the small value types of the decode ``plan()``: its unchecked arguments
(``PlanInputs``), those checked where a plan-time tensor param is sized by them
(``CheckedSizes``, ``checked_sizes``), what a plan fixes about the launch (``DecodeShape``),
what the fast path reuses from the last checked plan (``FastPathKey``, ``scalar_key``), which
arguments it takes (``fast_path_takes``) and where it takes page ids from (``ids_placement``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from attnc.runtime.checks import memory, tensors
from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.value_keys import value_key

MAX_Q_LEN = 8  # query tokens per request a decode plan takes

_Tensor = torch.Tensor
_I32 = torch.int32


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


class CheckedSizes(NamedTuple):
    """The arguments of ``plan()`` that plan-time tensor params are sized by, checked there
    (``DecodeMaskPlanning._mask_ranges``) and handed on so that nothing checks them again: the
    head counts, head_dim and q_len as ints, and kv_indptr as a contiguous CPU int32 tensor
    of its own (not the caller's memory) whose entries passed
    ``checks.tensors.check_indptr_values`` (the planner is told so)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    q_len: int
    kv_indptr: torch.Tensor


def checked_sizes(
    kv_indptr: object, num_qo_heads: object, num_kv_heads: object, head_dim: object, q_len: object
) -> CheckedSizes:
    """The sizes tensor params given to ``plan()`` are checked against, checked in this
    order: the head counts and head_dim, q_len, kv_indptr (the tensor, then its entries).
    kv_indptr comes back as a copy of its own (``tensors.host_int32_copy``): the caller's
    code run after the check (``float(sm_scale)``, say) cannot change the values planned."""
    tensors.check_heads(num_qo_heads, num_kv_heads, head_dim)  # type: ignore[arg-type]
    q_len = tensors.check_int("q_len_per_request", q_len, 1, MAX_Q_LEN)
    indptr = tensors.host_int32_copy("kv_indptr", kv_indptr)
    tensors.check_indptr_values("kv_indptr", indptr)
    heads = int(num_qo_heads), int(num_kv_heads), int(head_dim)  # type: ignore[call-overload]
    return CheckedSizes(*heads, q_len, indptr)


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


def fast_path_takes(
    fast: FastPathKey,
    program: RangeProgram | None,
    kv_indptr: object,
    kv_indices: object,
    kv_last_page_len: object,
    num_qo_heads: object,
    num_kv_heads: object,
    head_dim: object,
    page_size: object,
    q_len_per_request: object,
    sm_scale: object,
    dtype: object,
) -> bool:
    """Whether ``plan()``'s fast path takes these arguments: the scalars of the last checked
    plan ``fast`` (same types, so their checks pass again) and its planned mask's rows
    (``program``: none, or the same planned mask's rows object), and a page table it takes
    as it is (``_plain_tables``). Everything else is checked in C++."""
    return (
        program is fast.program
        and _plain_tables(kv_indptr, kv_indices, kv_last_page_len)
        # types before the key: comparing a numpy array to it is ambiguous
        and type(num_qo_heads) is int
        and type(num_kv_heads) is int
        and type(head_dim) is int
        and type(page_size) is int
        and type(q_len_per_request) is int
        and (sm_scale is None or type(sm_scale) is float)
        and type(dtype) is torch.dtype
        and (num_qo_heads, num_kv_heads, head_dim, page_size, q_len_per_request, sm_scale, dtype)
        == fast.key
    )


def _plain_tables(kv_indptr: object, kv_indices: object, kv_last_page_len: object) -> bool:
    """True for a page table as contiguous 1-D int32 tensors with storage behind them, the
    indptr and last-page lengths on the CPU (the page ids on a device or the CPU:
    ``ids_placement``)."""
    return (
        type(kv_indptr) is _Tensor
        and type(kv_last_page_len) is _Tensor
        and type(kv_indices) is _Tensor
        and not memory.transforms_active()  # vmap wraps plain Tensors without storage
        and kv_indptr.dtype is _I32
        and kv_last_page_len.dtype is _I32
        and kv_indices.dtype is _I32
        and kv_indptr.is_cpu
        and kv_last_page_len.is_cpu
        and kv_indptr.dim() == 1
        and kv_last_page_len.dim() == 1
        and kv_indices.dim() == 1
        and kv_indptr.is_contiguous()
        and kv_last_page_len.is_contiguous()
        and kv_indices.is_contiguous()
        # views with the negative bit hold -x for x: the checked path reads them resolved
        and not (kv_indptr.is_neg() or kv_last_page_len.is_neg() or kv_indices.is_neg())
        # bytes behind each (not a zero tensor or a freed storage): checked then otherwise
        and memory.storage_holds(kv_indptr)
        and memory.storage_holds(kv_last_page_len)
        and memory.storage_holds(kv_indices)
    )


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
