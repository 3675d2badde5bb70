"""Owns: the ``attnc::decode`` torch custom op, through which ``BatchDecodeWrapper.run()``
launches under ``torch.compile``, and the handle registry that lets the op find its wrapper
(a custom op takes no Python objects, so the wrapper travels as an int handle).

Eager ``run()`` calls the ctypes launcher directly (a custom op dispatch costs ~25 us).
"""

from __future__ import annotations

import itertools
import weakref

import torch

from attnc.runtime.wrappers.op_fakes import register_attention_fake
from attnc.runtime.wrappers.params_lists import join_params

_WRAPPERS: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def register_wrapper(wrapper: object) -> int:
    """A new handle for ``wrapper`` (kept while the wrapper lives)."""
    handle = next(_HANDLES)
    _WRAPPERS[handle] = wrapper
    return handle


def live_wrapper(handle: int) -> object:
    """The wrapper of ``handle``; a handle whose wrapper is gone (a graph, from
    ``torch.export`` or ``torch.compile``, that outlived it) is a ``RuntimeError`` naming it."""
    wrapper = _WRAPPERS.get(handle)
    if wrapper is None:
        raise RuntimeError(
            f"attnc::decode: wrapper handle {handle} names no live BatchDecodeWrapper; "
            "keep the wrapper a graph calls alive while the graph is used"
        )
    return wrapper


@torch.library.custom_op("attnc::decode", mutates_args=())
def decode_op(
    handle: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    int_params: list[int],
    float_params: list[float],
    tensor_params: list[torch.Tensor],
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional decode of the wrapper ``handle`` (its current plan): (O, LSE or empty)."""
    wrapper = live_wrapper(handle)
    values = join_params(wrapper.variant.params, int_params, float_params, tensor_params)  # type: ignore[attr-defined]
    return wrapper._launch_functional(q, k, v, values, return_lse)  # type: ignore[attr-defined,no-any-return]


register_attention_fake(decode_op, q_index=1)
