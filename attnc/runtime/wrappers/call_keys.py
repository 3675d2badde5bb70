"""Owns: the keys of the eager call caches of the wrappers' ``run()`` (decode's call cache,
``decode_calls.py``, and prefill's call memo, ``prefill_calls.py``): what a call's checks
looked at, and the byte spans for the overlap tests of a repeated call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from attnc.runtime.checks.memory import is_fake, transforms_active
from attnc.runtime.checks.tensors import is_dense
from attnc.runtime.value_keys import value_key

_SCALAR_TYPES = (int, float, bool)


def byte_span(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past the last element ``t`` can address."""
    if t.is_contiguous():
        return t.numel() * t.element_size()
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def param_tensors(values: Mapping[str, object]) -> tuple[tuple[str, torch.Tensor], ...]:
    """The tensor params of resolved ``values``, named as errors name them."""
    return tuple((f"param '{n}'", t) for n, t in values.items() if isinstance(t, torch.Tensor))


def param_ranges(values: Mapping[str, object]) -> tuple[tuple[int, int], ...]:
    """The byte ranges ``[start, end)`` of the tensor params of ``values``."""
    return tuple((t.data_ptr(), t.data_ptr() + byte_span(t)) for _, t in param_tensors(values))


def overlaps_any(start: int, end: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    """Whether ``[start, end)`` meets one of ``ranges``."""
    return any(start < e and s < end for s, e in ranges)


def tensor_key(t: torch.Tensor) -> tuple[object, ...]:
    """A tensor by data pointer, shape, strides, dtype and device."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


def tensor_meta(t: torch.Tensor) -> tuple[object, ...]:
    """A tensor by shape, strides, dtype and device (not by address)."""
    return (t.shape, t.stride(), t.dtype, t.device)


def _plain(t: torch.Tensor) -> bool:
    """A tensor a key may stand for: dense, not fake, without torch's negative bit (which the
    checks refuse, and which its metadata key would not show). Inside a torch.func transform
    no call is keyed (``call_key``)."""
    return is_dense(t) and not t.is_neg() and not is_fake(t)


def call_key(
    q: object,
    kv: object,
    out: object,
    return_lse: bool,
    params: Mapping[str, object],
    kv_key: Callable[[torch.Tensor], tuple[object, ...]] = tensor_key,
) -> tuple[object, ...] | None:
    """Everything the checks of a ``run()`` depend on, or None when the call is not
    cacheable: q and ``out`` by :func:`tensor_meta`, the KV tensors by ``kv_key``, scalar
    params by type and value, tensor params by identity and :func:`tensor_key`. Only ordinary
    dense tensors (no negative bit, not fake) and int / float / bool scalars are cacheable,
    outside torch.func transforms."""
    if not isinstance(q, torch.Tensor) or not _plain(q) or transforms_active():
        return None
    if out is None:
        out_key: object = None
    elif isinstance(out, torch.Tensor) and _plain(out):
        out_key = tensor_meta(out)
    else:
        return None
    if isinstance(kv, torch.Tensor) and _plain(kv):
        kv_part: object = kv_key(kv)
    elif (
        isinstance(kv, (tuple, list))
        and len(kv) == 2
        and isinstance(kv[0], torch.Tensor)
        and isinstance(kv[1], torch.Tensor)
        and _plain(kv[0])
        and _plain(kv[1])
    ):
        kv_part = (kv_key(kv[0]), kv_key(kv[1]))
    else:
        return None
    param_key: list[object] = []
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            if not _plain(value):
                return None
            # The object and its metadata: an in-place as_strided_ or resize_ keeps both the
            # object and its pointer, and a checked call would pack or refuse it anew.
            param_key.append((name, id(value), *tensor_key(value)))
        elif type(value) in _SCALAR_TYPES:
            param_key.append((name, *value_key(value)))
        else:
            return None
    return (tensor_meta(q), kv_part, out_key, return_lse, *param_key)
