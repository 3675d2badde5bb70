"""Owns: the checks of ``BatchPrefillWrapper.plan()``'s index tensors (qo_indptr, kv_indptr,
and for paged KV kv_indices, kv_last_page_len and page_size). The host planner validates the
int32 values, derives the lengths and reports a failure as a code (worded by
``checks/page_table.py``); arguments it does not take (not 1-D int32 tensors on the CPU or a
CUDA device, paged arguments missing or not an int ``page_size``) are checked by
``check_indices`` in Python, all of them in the planner's order, so a batch with several
problems gets the same error either way.
"""

from __future__ import annotations

import torch

from attnc.runtime.checks import page_table, tensors
from attnc.runtime.checks.limits import (
    check_paged_kv_tokens,
    check_query_tokens,
    check_ragged_kv_tokens,
)
from attnc.runtime.planning.prefill_planner import PrefillPlanner


def checked_batch(
    planner: PrefillPlanner,
    qo_indptr: object,
    kv_indptr: object,
    kv_indices: object,
    kv_last_page_len: object,
    page_size: object,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Check the index tensors in the host planner (which keeps the lengths): the int32
    host qo_indptr and kv_indptr it checked (its copies: code run after the check cannot
    change them) and whether the KV is paged. Arguments the planner does not take are refused
    by the Python checks (``check_indices``)."""
    arrays = index_arrays(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size)
    if arrays is None:
        args = (qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size)
        check_indices(*args)  # type: ignore[arg-type]
        raise RuntimeError("attnc: prefill plan: the checks passed arguments the planner refuses")
    if not planner.check(*arrays):
        raise planner.failure()
    return (*planner.checked_indptrs(), arrays[2] is not None)


def index_arrays(
    qo_indptr: object,
    kv_indptr: object,
    kv_indices: object,
    kv_last_page_len: object,
    page_size: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int] | None:
    """Contiguous int32 host copies of the index tensors and the page size (1: ragged), or
    None when an argument is not what ``check_indices`` accepts (it then says why)."""
    qo, kv = _int32_array(qo_indptr), _int32_array(kv_indptr)
    if qo is None or kv is None:
        return None
    if kv_indices is None:
        if kv_last_page_len is not None or page_size is not None:
            return None
        return qo, kv, None, None, 1
    idx, last = _int32_array(kv_indices), _int32_array(kv_last_page_len)
    if idx is None or last is None or page_size is None:
        return None
    try:
        page = tensors.check_int("page_size", page_size)
    except ValueError:
        return None
    return qo, kv, idx, last, page


def _int32_array(t: object) -> torch.Tensor | None:
    """A 1-D int32 tensor as a contiguous CPU tensor whose bytes are its values (None: not
    such a tensor; a view with the negative bit comes back resolved: check_index_tensor)."""
    try:
        t = tensors.check_index_tensor("", t)
    except ValueError:
        return None
    if t.is_cpu and t.is_contiguous():
        return t
    return t.detach().to("cpu").contiguous()


def check_indices(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    page_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """Host copies of the index tensors, checked (``checks.tensors``, ``checks.limits``) in
    the host planner's order (``attnc/kernels/host/prefill_plan_check.h``): for arguments the
    planner does not take, and as the reference its checks are tested against."""
    qo_host = tensors.check_indptr("qo_indptr", qo_indptr)
    kv_host = tensors.check_indptr("kv_indptr", kv_indptr)
    if kv_host.numel() != qo_host.numel():
        raise page_table.indptr_count(kv_host.numel(), qo_host.numel())
    check_query_tokens(qo_host)
    if kv_indices is None:
        if kv_last_page_len is not None or page_size is not None:
            raise ValueError("kv_indices: required when kv_last_page_len/page_size are given")
        check_ragged_kv_tokens(kv_host)
        return qo_host, kv_host, None, None, 1
    if page_size is None:
        raise ValueError("page_size: a paged plan needs page_size (an int >= 1)")
    page = tensors.check_int("page_size", page_size)
    if kv_last_page_len is None:
        raise ValueError("kv_last_page_len: required for a paged plan")
    idx_host = tensors.check_kv_indices(kv_indices, int(kv_host[-1]))
    last_host = tensors.check_last_page_len(kv_last_page_len, kv_host, page)
    check_paged_kv_tokens(kv_host, last_host, page)
    return qo_host, kv_host, idx_host, last_host, page
