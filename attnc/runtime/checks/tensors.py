"""Host-side input checks for prefill: each problem is a ``ValueError`` naming the tensor.

Pure functions over tensor metadata and small host copies of index tensors, so they are tested
with CPU tensors (pass ``device_type="cpu"``); the runtime uses ``device_type="cuda"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

HEAD_DIMS = (64, 128, 256)
KV_DTYPES = (torch.bfloat16, torch.float16)
KV_LAYOUTS = ("NHD", "HND")


def check_heads(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """Head counts and head_dim the kernels support."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: must be one of {list(HEAD_DIMS)}, got {head_dim}")
    if num_qo_heads <= 0 or num_kv_heads <= 0:
        raise ValueError(
            f"num_qo_heads/num_kv_heads: must be positive, got {num_qo_heads}/{num_kv_heads}"
        )
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads: {num_qo_heads} is not a multiple of num_kv_heads {num_kv_heads}"
        )


def check_kv_layout(kv_layout: str) -> None:
    """``NHD`` or ``HND``."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout: must be 'NHD' or 'HND', got {kv_layout!r}")


def check_dtype_arg(dtype: torch.dtype) -> None:
    """The activation dtype named in ``plan()``."""
    if dtype not in KV_DTYPES:
        raise ValueError(f"dtype: must be torch.bfloat16 or torch.float16, got {dtype}")


def check_data_tensor(
    name: str, t: object, shape: Sequence[int | None], device_type: str = "cuda"
) -> torch.Tensor:
    """A q/k/v/o/cache tensor: a torch.Tensor on ``device_type``, bf16/fp16, of ``shape``
    (``None`` = any size), with a contiguous last dim."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != device_type:
        raise ValueError(f"{name}: must be on a {device_type} device, got {t.device}")
    if t.dtype not in KV_DTYPES:
        raise ValueError(f"{name}: dtype must be torch.bfloat16 or torch.float16, got {t.dtype}")
    _check_shape(name, t, shape)
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got {t.stride(-1)}")
    return t


def _check_shape(name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    ok = t.dim() == len(shape) and all(
        s is None or s == n for s, n in zip(shape, t.shape, strict=True)
    )
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")


def check_same_kind(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``t`` has the same dtype and device as ``ref``."""
    if t.dtype != ref.dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from {ref_name} dtype {ref.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")


def host_index_tensor(name: str, t: object, length: int | None = None) -> torch.Tensor:
    """A 1-D int32 index tensor; returns a CPU int64 copy for host-side checks."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {list(t.shape)}")
    if length is not None and t.numel() != length:
        raise ValueError(f"{name}: expected {length} entries, got {t.numel()}")
    return t.detach().to("cpu", torch.int64)


def check_indptr(name: str, t: object) -> torch.Tensor:
    """An indptr: int32, 1-D, at least one entry, starts at 0, non-decreasing."""
    host = host_index_tensor(name, t)
    if host.numel() == 0:
        raise ValueError(f"{name}: needs at least one entry (batch + 1)")
    if host[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {int(host[0])}")
    drops = torch.nonzero(host[1:] < host[:-1]).flatten()
    if drops.numel():
        i = int(drops[0]) + 1
        raise ValueError(
            f"{name}: must be non-decreasing, but {name}[{i}]={int(host[i])} < "
            f"{name}[{i - 1}]={int(host[i - 1])}"
        )
    return host


def check_indptr_total(name: str, host: torch.Tensor, what: str, size: int) -> None:
    """The last indptr value equals ``size`` (described by ``what``, e.g. ``q.shape[0]``)."""
    if int(host[-1]) != size:
        raise ValueError(f"{name}: last value {int(host[-1])} does not match {what} = {size}")


def check_kv_indices(kv_indices: object, nnz_pages: int) -> torch.Tensor:
    """Page ids: int32, 1-D, at least ``kv_indptr[-1]`` entries, non-negative."""
    host = host_index_tensor("kv_indices", kv_indices)
    if host.numel() < nnz_pages:
        raise ValueError(f"kv_indices: has {host.numel()} entries, but kv_indptr[-1] = {nnz_pages}")
    host = host[:nnz_pages]
    if host.numel() and int(host.min()) < 0:
        raise ValueError(f"kv_indices: page index {int(host.min())} is negative")
    return host


def check_pages_in_range(max_page: int, num_pages: int) -> None:
    """Every page id used by the plan exists in the cache."""
    if max_page >= num_pages:
        raise ValueError(
            f"kv_indices: page index {max_page} out of range for a cache of {num_pages} pages"
        )


def check_last_page_len(
    kv_last_page_len: object, kv_indptr: torch.Tensor, page_size: int
) -> torch.Tensor:
    """``kv_last_page_len``: int32 ``[batch]``, in [1, page_size] for requests with pages."""
    batch = kv_indptr.numel() - 1
    host = host_index_tensor("kv_last_page_len", kv_last_page_len, batch)
    pages = kv_indptr[1:] - kv_indptr[:-1]
    for i in range(batch):
        n = int(host[i])
        if pages[i] > 0 and not 1 <= n <= page_size:
            raise ValueError(
                f"kv_last_page_len: kv_last_page_len[{i}]={n} is outside [1, page_size={page_size}]"
            )
    return host


def same_device_index(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` live on the same device."""
    return a.device == b.device
