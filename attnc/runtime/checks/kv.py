"""Turning the ``kv`` argument of ``run()`` into K/V views plus a layout code, with checks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnc.compiler.numeric import I32_MAX
from attnc.runtime import abi
from attnc.runtime.checks.tensors import check_data_tensor, check_same_kind


@dataclass(frozen=True)
class KvViews:
    """K and V views as the kernel reads them, the ABI layout code and the page count."""

    k: torch.Tensor
    v: torch.Tensor
    layout: int
    num_pages: int
    page_size: int


def ragged_kv(kv: object, num_kv_heads: int, head_dim: int, device_type: str) -> KvViews:
    """``(k, v)``, each ``[total_kv, H_kv, D]``."""
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise ValueError("kv: a ragged plan expects a (k, v) tuple of [total_kv, H_kv, D] tensors")
    k = check_data_tensor("k", kv[0], (None, num_kv_heads, head_dim), device_type)
    v = check_data_tensor("v", kv[1], (k.shape[0], num_kv_heads, head_dim), device_type)
    check_same_kind("v", v, "k", k)
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    return KvViews(k, v, abi.KV_RAGGED, 0, 1)


def paged_kv(
    kv: object, kv_layout: str, page_size: int, num_kv_heads: int, head_dim: int, device_type: str
) -> KvViews:
    """A cache ``[pages, 2, ...]`` or a ``(k_cache, v_cache)`` tuple, NHD or HND."""
    inner = (page_size, num_kv_heads) if kv_layout == "NHD" else (num_kv_heads, page_size)
    code = abi.paged_kv_code(kv_layout)
    if isinstance(kv, torch.Tensor):
        cache = check_data_tensor("kv", kv, (None, 2, *inner, head_dim), device_type)
        _check_page_count("kv", cache.shape[0])
        return KvViews(cache[:, 0], cache[:, 1], code, cache.shape[0], page_size)
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise ValueError(
            f"kv: a paged plan expects a [pages, 2, ...] cache tensor or a (k_cache, v_cache) "
            f"tuple ({kv_layout})"
        )
    k = check_data_tensor("k_cache", kv[0], (None, *inner, head_dim), device_type)
    v = check_data_tensor("v_cache", kv[1], (k.shape[0], *inner, head_dim), device_type)
    check_same_kind("v_cache", v, "k_cache", k)
    if k.stride() != v.stride():
        raise ValueError(f"v_cache: strides {v.stride()} differ from k_cache strides {k.stride()}")
    _check_page_count("k_cache", k.shape[0])
    return KvViews(k, v, code, k.shape[0], page_size)


def _check_page_count(name: str, pages: int) -> None:
    """Page ids, and the page count the kernels check them against, are int32: a cache of
    2**31 pages or more (a view with a zero page stride, say) would have its last id called
    outside it."""
    if pages > I32_MAX:
        raise ValueError(
            f"{name}: holds {pages} pages; page ids are int32, so a cache holds at most {I32_MAX}"
        )
