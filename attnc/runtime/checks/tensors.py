"""Host-side input checks for prefill: each problem is a ``ValueError`` naming the tensor
(page-table and index-list messages from ``checks/page_table.py``).

Pure functions over tensor metadata and small host copies of index tensors, so they are tested
with CPU tensors (pass ``device_type="cpu"``); the runtime uses ``device_type="cuda"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from attnc.codegen.instances import HEAD_DIMS
from attnc.compiler.numeric import F32_MAX, F32_MIN_NORMAL, F64_INT_LIMIT
from attnc.dsl.errors import printable
from attnc.dsl.limits import I32_MAX
from attnc.dsl.literals import nearest_f32
from attnc.runtime.checks import page_table
from attnc.runtime.checks.memory import (
    byte_range,
    check_has_memory,
    check_storage_holds,
    storage_holds,
    transforms_active,
)
from attnc.runtime.tracing import compiling

KV_DTYPES = (torch.bfloat16, torch.float16)
KV_LAYOUTS = ("NHD", "HND")


# The float32 range a softmax scale must round into (the kernels take it as a float32).
MAX_HEADS = 2**30 - 1  # the host planners (prefill and decode) take head counts below 2**30

# What the kernels' 16-byte vector loads and stores need of q, K, V and O (launch_checks.h
# check_qkvo_layout): a 16-byte aligned start and, but for the last dim, strides in whole
# multiples of 8 elements (q, K, V) or of the template's multiple for O.
VECTOR_ALIGN_BYTES = 16
QKV_STRIDE_MULTIPLE = 8


def check_int(name: str, value: object, minimum: int = 1, maximum: int = I32_MAX) -> int:
    """An integer argument (a Python or numpy int, never a bool or a float) in
    ``[minimum, maximum]``, as a Python ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{name}: must be in [{minimum}, {maximum}], got {number}")
    return number


def check_flag(name: str, value: object) -> bool:
    """An on/off argument: ``True`` or ``False`` (a string such as ``"no"`` would count as on)."""
    if value is True or value is False:
        return value
    raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")


def check_sm_scale(sm_scale: object, head_dim: int) -> float:
    """The softmax scale as a Python float: ``1 / sqrt(head_dim)`` for None, else a real
    number (:func:`sm_scale_value`) that is finite and > 0. The kernels keep the running row
    max of raw dot products for variants whose score is the plain scaled dot product, which
    is the max of the logits only for a positive scale."""
    value = sm_scale_value(sm_scale, head_dim)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"sm_scale: must be a finite number > 0, got {value!r}")
    as_f32 = nearest_f32(value)
    if not F32_MIN_NORMAL <= as_f32 <= F32_MAX:
        raise ValueError(
            f"sm_scale: {value!r} is {as_f32!r} as the kernels' float32 scale; give a number "
            f"from {F32_MIN_NORMAL!r} to {F32_MAX!r}"
        )
    return value


def is_bool_value(value: object) -> bool:
    """A bool of Python, NumPy or torch (a bool tensor): never read as a number."""
    return isinstance(value, (bool, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool
    )


def sm_scale_value(sm_scale: object, head_dim: int) -> float:
    """The softmax scale as a Python float, any value (the eager reference takes NaN, 0 or a
    negative scale): ``1 / sqrt(head_dim)`` for None, else a Python or numpy float or int or
    a one-element tensor, never a bool (Python's, numpy's or a bool tensor), a complex, a
    string or an int past the float range."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, (str, bytes)) or is_bool_value(sm_scale):
        raise _not_a_float(sm_scale)
    if isinstance(sm_scale, numbers.Complex) and not isinstance(sm_scale, numbers.Real):
        raise _not_a_float(sm_scale)  # numpy's complex would drop its imaginary part
    if isinstance(sm_scale, int) and not -F64_INT_LIMIT < sm_scale < F64_INT_LIMIT:
        raise _not_a_float(sm_scale)  # by a comparison: torch.compile traces this check
    try:
        return float(sm_scale)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise _not_a_float(sm_scale) from None


SHOWN_CHARS = 80  # the most characters of a value an error quotes


def shown_value(value: object) -> str:
    """``repr(value)`` as an error quotes it: escaped, and cut after ``SHOWN_CHARS``."""
    text = printable(repr(value))
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


def _not_a_float(sm_scale: object) -> ValueError:
    kind = type(sm_scale).__name__
    return ValueError(f"sm_scale: expected a float, got {kind} {shown_value(sm_scale)}")


def check_heads(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """Head counts and head_dim the kernels support (ints, not bools or floats; head counts
    up to ``MAX_HEADS``)."""
    check_int("num_qo_heads", num_qo_heads, maximum=MAX_HEADS)
    check_int("num_kv_heads", num_kv_heads, maximum=MAX_HEADS)
    check_int("head_dim", head_dim)
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


def check_kv_layout(kv_layout: str) -> str:
    """``NHD`` or ``HND`` (a str subclass equal to one, a ``StrEnum`` member say, gives the
    plain string)."""
    if not isinstance(kv_layout, str) or kv_layout not in KV_LAYOUTS:  # `in` on an array: ambiguous
        raise ValueError(f"kv_layout: must be 'NHD' or 'HND', got {_typed_value(kv_layout)}")
    return "NHD" if kv_layout == "NHD" else "HND"


def workspace_bytes(workspace_buffer: object, require_cuda: bool = False) -> torch.Tensor:
    """A wrapper's ``workspace_buffer`` checked (a contiguous tensor; on a CUDA device when
    ``require_cuda``) and viewed as flat bytes."""
    if (
        not isinstance(workspace_buffer, torch.Tensor)
        or not is_dense(workspace_buffer)
        or not workspace_buffer.is_contiguous()
    ):
        raise ValueError("workspace_buffer: expected a contiguous torch.Tensor with memory")
    if workspace_buffer.is_conj() or workspace_buffer.is_neg():
        raise ValueError(
            "workspace_buffer: a view with torch's conjugate or negative bit (its bytes are "
            "not what it holds); pass a plain tensor, e.g. torch.empty(n, dtype=torch.uint8)"
        )
    if require_cuda and workspace_buffer.device.type != "cuda":
        raise ValueError(
            f"workspace_buffer: must be on a cuda device, got {workspace_buffer.device}"
        )
    check_has_memory("workspace_buffer", workspace_buffer)
    check_storage_holds("workspace_buffer", workspace_buffer)
    offset = workspace_buffer.data_ptr() % VECTOR_ALIGN_BYTES
    if offset:
        raise ValueError(
            f"workspace_buffer: starts {offset} bytes past a 16-byte boundary; the kernels "
            f"read their work lists with 16-byte loads (pass a tensor of its own)"
        )
    return workspace_buffer.view(-1).view(torch.uint8)


def check_dtype_arg(dtype: torch.dtype) -> None:
    """The activation dtype named in ``plan()``."""
    if not isinstance(dtype, torch.dtype) or dtype not in KV_DTYPES:
        raise ValueError(
            f"dtype: must be torch.bfloat16 or torch.float16, got {_typed_value(dtype)}"
        )


def _typed_value(value: object) -> str:
    """``shown_value(value)``, after its type's name unless it is a str or a torch dtype."""
    if isinstance(value, (str, torch.dtype)):
        return shown_value(value)
    return f"{type(value).__name__} {shown_value(value)}"


def is_dense(t: torch.Tensor) -> bool:
    """True for an ordinary strided tensor: not sparse, nested or mkldnn (those have no data
    pointer, sizes or strides the kernels can read), nor torch's zero tensor (no memory at
    all: its data pointer is null)."""
    if t.layout is not torch.strided or t.is_nested:
        return False
    # traced by torch.compile the tensor is a stand-in: a zero tensor passes there, like the
    # address checks (which compiled graphs skip too)
    return compiling() or not t._is_zerotensor()


def layout_name(t: torch.Tensor) -> str:
    """How an error names the layout of a tensor that is not dense (``sparse_coo``, ...)."""
    if t.is_nested:
        return "nested"
    if t.layout is torch.strided and t._is_zerotensor():
        return "zero-tensor (no memory)"
    return str(t.layout).removeprefix("torch.")


def check_param_memory(values: Mapping[str, object], packed: bool = False) -> None:
    """``check_has_memory`` and ``check_storage_holds`` of each tensor among param
    ``values``, before a plan reads them or (``packed``) their addresses are packed for a
    kernel (the reference takes any tensor)."""
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            continue
        if type(value) is not torch.Tensor or transforms_active():
            check_has_memory(f"param '{name}'", value)
        # A sparse, nested, zero or meta one is refused by the param checks, with its
        # declaration: plan() runs them next. A custom op's body packs values that passed
        # them as the graph was traced, where a zero tensor's stand-in passes: refused here.
        strided = value.layout is torch.strided and not value.is_nested
        if packed and strided and not is_dense(value):
            raise ValueError(
                f"param '{name}': expected a dense tensor, got a {layout_name(value)} one"
            )
        if is_dense(value) and not value.is_meta and not storage_holds(value):
            check_storage_holds(f"param '{name}'", value)


def negated_view(t: torch.Tensor) -> bool:
    """True for a view with torch's negative bit set. Traced by torch.compile the tensor is a
    stand-in whose bit is not known: False there (like the address checks, which compiled
    graphs skip too)."""
    return not compiling() and t.is_neg()


# Why a view with torch's negative bit is refused where the kernels read or write its bytes.
NEGATIVE_BIT = (
    "a view with torch's negative bit set (the .imag of a conjugated complex tensor, say): "
    "its memory holds the negated values, which the kernels would read as they are; pass "
    ".resolve_neg() of it"
)


def check_data_tensor(
    name: str, t: object, shape: Sequence[int | None], device_type: str = "cuda"
) -> torch.Tensor:
    """A q/k/v/o/cache tensor: a torch.Tensor on ``device_type``, bf16/fp16, of ``shape``
    (``None`` = any size), with a contiguous last dim and no negative bit."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not is_dense(t):
        raise ValueError(f"{name}: expected a dense tensor, got a {layout_name(t)} one")
    if negated_view(t):
        raise ValueError(f"{name}: {NEGATIVE_BIT}")
    if t.device.type != device_type:
        raise ValueError(f"{name}: must be on a {device_type} device, got {t.device}")
    check_has_memory(name, t)
    check_storage_holds(name, t)
    if t.dtype not in KV_DTYPES:
        raise ValueError(f"{name}: dtype must be torch.bfloat16 or torch.float16, got {t.dtype}")
    _check_shape(name, t, shape)
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got {t.stride(-1)}")
    return t


def _check_shape(name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    if t.shape == shape:  # every size given and equal: the run() path, one comparison
        return
    if shape and shape[0] is None and t.dim() == len(shape) and t.shape[1:] == shape[1:]:
        return  # any first size (a token or page count), the rest equal
    ok = t.dim() == len(shape) and all(
        s is None or s == n for s, n in zip(shape, t.shape, strict=True)
    )
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")


def check_out(out: object, q: torch.Tensor) -> torch.Tensor:
    """The ``out=`` tensor of ``run()``: like ``q`` in shape, dtype and device, no two of its
    elements at one address (no zero strides), and sharing no memory with ``q``."""
    out = check_data_tensor("out", out, tuple(q.shape), q.device.type)
    check_same_kind("out", out, "q", q)
    if overlaps_itself(out):
        raise ValueError(
            f"out: elements overlap in memory (strides {list(out.stride())} for shape "
            f"{list(out.shape)}); pass a tensor with one address per element"
        )
    if shares_memory(out, q):
        raise ValueError("out: overlaps q in memory; the kernel reads q while writing out")
    return out


def check_apart(name: str, t: torch.Tensor, others: Sequence[tuple[str, torch.Tensor]]) -> None:
    """``t`` (an output the kernel writes) shares no memory with the named inputs it reads
    while writing (K, V: other CTAs still load tiles of them); all on one device."""
    start, end = byte_range(t)
    for other_name, other in others:
        other_start, other_end = byte_range(other)
        if start < other_end and other_start < end and start < end and other_start < other_end:
            raise ValueError(
                f"{name}: overlaps {other_name} in memory; the kernel reads {other_name} "
                f"while writing {name}"
            )


def check_outside_workspace(
    workspace: tuple[int, int], named: Sequence[tuple[str, torch.Tensor | None]]
) -> None:
    """No tensor of ``named`` (None: absent) lies in the workspace's bytes
    ``[start, end)``, which the kernels write (split-KV partial states) and read (the
    plan's work lists) while they run."""
    ws_start, ws_end = workspace
    for name, t in named:
        if t is None:
            continue
        start, end = byte_range(t)
        if start < ws_end and ws_start < end and start < end:
            raise ValueError(
                f"{name}: overlaps workspace_buffer in memory; the kernels keep the plan's "
                f"work lists and partial states there"
            )


def check_vector_layout(named: Sequence[tuple[str, torch.Tensor | None, int]]) -> None:
    """Each tensor of ``named`` (name, tensor or None, stride multiple in elements) starts
    16-byte aligned and has every stride but the last dim's a multiple of its multiple
    (the kernels refused others with ATTNC_E_BAD_LAYOUT, naming no tensor)."""
    for name, t, multiple in named:
        if t is None:
            continue
        offset = t.data_ptr() % VECTOR_ALIGN_BYTES
        if offset:
            raise ValueError(
                f"{name}: starts {offset} bytes past a 16-byte boundary; the kernels' vector "
                f"loads need 16-byte aligned tensors (a view at an odd element offset is "
                f"not; pass a tensor of its own, e.g. .clone())"
            )
        if any(s % multiple for s in t.stride()[:-1]):
            raise ValueError(
                f"{name}: strides {list(t.stride())} are not all multiples of {multiple} "
                f"elements (the last dim's aside); the kernels' vector loads need them (pass "
                f"a contiguous tensor)"
            )


def overlaps_itself(t: torch.Tensor) -> bool:
    """True when two elements of ``t`` share an address (a zero or too small stride)."""
    if t.is_contiguous():  # row-major strides: one address per element
        return False
    dims = sorted((t.stride(i), t.shape[i]) for i in range(t.dim()) if t.shape[i] > 1)
    extent = 1  # elements spanned by the dims seen so far
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * (size - 1) + extent
    return False


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the byte ranges ``a`` and ``b`` address intersect (a conservative test)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, a1 = byte_range(a)
    b0, b1 = byte_range(b)
    return a0 < b1 and b0 < a1


def check_same_kind(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``t`` has the same dtype and device as ``ref``."""
    if t.dtype != ref.dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from {ref_name} dtype {ref.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")


INDEX_DEVICE_TYPES = ("cpu", "cuda")  # where index tensors may live (read back or copied)


def check_index_tensor(name: str, t: object) -> torch.Tensor:
    """A dense 1-D int32 tensor on the CPU or a CUDA device (its values unchecked): a meta
    tensor has no data to read, a sparse or nested one no plain array of ids. A view with
    torch's negative bit set (its memory holds the negated values) comes back resolved, a
    copy, so that code reading its bytes (the host planners) reads its values."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not is_dense(t):
        raise ValueError(f"{name}: expected a dense tensor, got a {layout_name(t)} one")
    if t.device.type not in INDEX_DEVICE_TYPES:
        raise ValueError(f"{name}: must be on the CPU or a CUDA device, got {t.device}")
    check_has_memory(name, t)
    check_storage_holds(name, t)
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {list(t.shape)}")
    return t.resolve_neg() if t.is_neg() else t


def host_int32(name: str, t: object) -> torch.Tensor:
    """A 1-D int32 index tensor, as a contiguous CPU int32 tensor (its values unchecked)."""
    return check_index_tensor(name, t).detach().to("cpu").contiguous()


def host_int32_copy(name: str, t: object) -> torch.Tensor:
    """``host_int32`` as a plain tensor in memory of its own (the caller's tensor, a view of
    it or a subclass's result is copied): values checked once cannot change after the check,
    whatever code the caller runs or writes to ``t`` later."""
    host = host_int32(name, t).as_subclass(torch.Tensor)  # as_subclass runs no override
    if type(t) is torch.Tensor:
        ptr = host.untyped_storage().data_ptr()
        if ptr not in (0, t.untyped_storage().data_ptr()):
            return host  # a copy already (from a device, a strided or a negated view)
    return host.clone()


def host_index_tensor(name: str, t: object, length: int | None = None) -> torch.Tensor:
    """A 1-D int32 index tensor; returns a CPU int64 copy for host-side checks."""
    host = host_int32(name, t)
    if length is not None and host.numel() != length:
        raise page_table.wrong_count(name, length, host.numel())
    return host.to(torch.int64)


def check_indptr(name: str, t: object) -> torch.Tensor:
    """An indptr: int32, 1-D, at least one entry, starts at 0, non-decreasing; returns a CPU
    int64 copy."""
    host = host_index_tensor(name, t)
    check_indptr_values(name, host)
    return host


def check_indptr_values(name: str, host: torch.Tensor) -> None:
    """The entries of an indptr already on the host (1-D, integers): at least one, the first
    0, non-decreasing (the first drop is named)."""
    if host.numel() == 0:
        raise page_table.indptr_empty(name)
    if host[0] != 0:
        raise page_table.indptr_start(int(host[0]), name)
    drops = torch.nonzero(host[1:] < host[:-1]).flatten()
    if drops.numel():
        i = int(drops[0]) + 1
        raise page_table.indptr_decreasing(i, int(host[i]), int(host[i - 1]), name)


def check_kv_indices(kv_indices: object, nnz_pages: int) -> torch.Tensor:
    """Page ids: int32, 1-D, at least ``kv_indptr[-1]`` entries, non-negative."""
    host = host_index_tensor("kv_indices", kv_indices)
    if host.numel() < nnz_pages:
        raise page_table.indices_short(host.numel(), nnz_pages)
    host = host[:nnz_pages]
    if host.numel() and int(host.min()) < 0:
        raise page_table.index_negative(int(host.min()))
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
    bad = torch.nonzero((pages > 0) & ((host < 1) | (host > page_size)))
    if bad.numel():  # the first request whose entry is out of range
        i = int(bad[0, 0])
        raise page_table.last_range(i, int(host[i]), page_size)
    return host


def same_device_index(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` live on the same device."""
    return a.device == b.device
