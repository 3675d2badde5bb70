"""``merge_state``: combine the attention states (O, LSE) of two disjoint KV ranges.

``o = e^{lse_a - lse} o_a + e^{lse_b - lse} o_b`` and ``lse = log(e^{lse_a} + e^{lse_b})``
(natural log), -inf safe: a row that saw no visible key in either range gets O 0, LSE -inf.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from attnc.runtime.build import jit, toolchain
from attnc.runtime.checks.tensors import I32_MAX, NEGATIVE_BIT, is_dense, layout_name
from attnc.runtime.tracing import compiling
from attnc.runtime.wrappers.cuda_stream import raw_stream

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_LIBS: dict[str, ctypes.CDLL] = {}  # by GPU arch: a host may hold GPUs of two archs
_LOCK = threading.Lock()


def _library(arch: str) -> ctypes.CDLL:
    """The merge_state module built for GPU ``arch`` (built or loaded once per arch)."""
    with _LOCK:
        lib = _LIBS.get(arch)
        if lib is None:
            from attnc.codegen.decode_module import render_merge_state_module

            lib = jit.load_library(
                jit.build_module("merge_state", render_merge_state_module(), arch=arch)
            )
            lib.attnc_merge_state.argtypes = [ctypes.c_void_p] * 6 + [
                ctypes.c_int64,
                ctypes.c_int32,
                ctypes.c_int32,
                ctypes.c_void_p,
            ]
            lib.attnc_merge_state.restype = ctypes.c_int
            _LIBS[arch] = lib
        return lib


def _check_kinds(*states: object) -> None:
    """The four states (o_a, lse_a, o_b, lse_b) are dense tensors without the negative bit,
    else a ``ValueError`` naming the first that is not."""
    for name, t in zip(("o_a", "lse_a", "o_b", "lse_b"), states, strict=True):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not is_dense(t):
            raise ValueError(f"{name}: expected a dense tensor, got a {layout_name(t)} one")
        if t.is_neg():
            raise ValueError(f"{name}: {NEGATIVE_BIT}")


def _check(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Every problem of the four states as a ``ValueError`` naming the argument: the kinds,
    then the dtypes and shapes, then the devices."""
    _check_kinds(o_a, lse_a, o_b, lse_b)
    _check_shapes(o_a, lse_a, o_b, lse_b)
    for name, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b)):
        if t.device.type != "cuda":
            raise ValueError(f"{name}: must be on a cuda device, got {t.device}")
    _check_one_device(o_a, lse_a, o_b, lse_b)


def _check_one_device(*states: torch.Tensor) -> None:
    """The four states on ``o_a``'s device, else a ``ValueError`` naming the first that is
    not (the fake op checks it too: states on meta and CPU gave results on both)."""
    device = states[0].device
    for name, t in zip(("lse_a", "o_b", "lse_b"), states[1:], strict=True):
        if t.device != device:
            raise ValueError(f"{name}: must be on the device of o_a ({device}), got {t.device}")


def _check_shapes(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> None:
    if o_a.dtype not in _DTYPE_CODES:
        raise ValueError(f"o_a: dtype must be float32, bfloat16 or float16, got {o_a.dtype}")
    if o_b.dtype != o_a.dtype or o_b.shape != o_a.shape:
        raise ValueError(
            f"o_b: expected {o_a.dtype} of shape {list(o_a.shape)}, "
            f"got {o_b.dtype} of shape {list(o_b.shape)}"
        )
    if o_a.dim() < 2:
        raise ValueError(
            f"o_a: expected at least two dims [rows, ..., head_dim], got shape {list(o_a.shape)}"
        )
    if not 1 <= o_a.shape[-1] <= I32_MAX:  # lse is written by a row's first element
        raise ValueError(
            f"o_a: head_dim (last dim) must be in [1, {I32_MAX}], got {o_a.shape[-1]} "
            f"(shape {list(o_a.shape)})"
        )
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.dtype != torch.float32 or t.shape != o_a.shape[:-1]:
            raise ValueError(
                f"{name}: expected float32 of shape {list(o_a.shape[:-1])}, "
                f"got {t.dtype} of shape {list(t.shape)}"
            )


def merge_state(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged ``(o, lse)`` of two states: ``o_*`` ``[N, ..., D]`` (at least two dims;
    fp32/bf16/fp16), ``lse_*`` float32 ``[N, ...]`` natural log; both results contiguous. Each
    argument must be a tensor (a list or an array is a ``ValueError`` naming it, before torch's
    dispatcher sees it); the rest is checked in the ``attnc::merge_state`` custom op, which
    ``torch.compile`` traces."""
    if not compiling():  # traced arguments are tensors; the op checks
        _check_kinds(o_a, lse_a, o_b, lse_b)
    return merge_state_op(o_a, lse_a, o_b, lse_b)


@torch.library.custom_op("attnc::merge_state", mutates_args=())
def merge_state_op(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``attnc::merge_state`` custom op behind :func:`merge_state`."""
    _check(o_a, lse_a, o_b, lse_b)
    o_a, lse_a, o_b, lse_b = (t.contiguous() for t in (o_a, lse_a, o_b, lse_b))
    o, lse = _outputs(o_a, lse_a)
    rows = lse_a.numel()
    lib = _library(toolchain.device_arch(o_a.device))
    with torch.cuda.device(o_a.device):  # the launch runs on the current device
        stream = raw_stream(o_a.device)
        rc = lib.attnc_merge_state(
            o_a.data_ptr(), lse_a.data_ptr(), o_b.data_ptr(), lse_b.data_ptr(),
            o.data_ptr(), lse.data_ptr(), rows, o_a.shape[-1], _DTYPE_CODES[o_a.dtype], stream,
        )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"attnc: merge_state failed with code {rc}")
    return o, lse


@merge_state_op.register_fake
def _merge_state_fake(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_kinds(o_a, lse_a, o_b, lse_b)
    _check_shapes(o_a, lse_a, o_b, lse_b)
    _check_one_device(o_a, lse_a, o_b, lse_b)
    return _outputs(o_a, lse_a)


def _outputs(o_a: torch.Tensor, lse_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's results, contiguous whatever the strides of the states (the real op and its
    fake must agree: an ``empty_like`` of a permuted state keeps its strides)."""
    return o_a.new_empty(o_a.shape), lse_a.new_empty(lse_a.shape)
