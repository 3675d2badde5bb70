"""Owns: the fake (shape-only) implementation shared by the attention custom ops
(``attnc::prefill``, ``attnc::single_prefill``, ``attnc::decode``), which ``torch.compile``
traces instead of launching: each returns O shaped like ``q`` and an fp32 LSE of shape
``[tokens, heads]`` (or an empty one when its last argument ``return_lse`` is false);
and ``traced_result``, which turns the (O, LSE) of such an op into what ``run()`` returns."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnc.runtime.checks import tensors


def attention_outputs(
    q: torch.Tensor, return_lse: bool, contiguous_o: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh (O, LSE) for queries ``q`` ``[tokens, heads, head_dim]``: O laid out like ``q``
    (row-major when ``contiguous_o``); LSE is empty unless ``return_lse``."""
    if contiguous_o:
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        o = torch.empty_like(q)
    return o, new_lse(q) if return_lse else torch.empty((0,), dtype=torch.float32, device=q.device)


def new_lse(q: torch.Tensor) -> torch.Tensor:
    """A new float32 LSE ``[tokens, heads]`` for queries ``q`` ``[tokens, heads, head_dim]``."""
    return torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)


def register_attention_fake(
    op: object, q_index: int, contiguous_o: bool = False
) -> Callable[..., object]:
    """Registers on custom op ``op`` the fake that reads ``q`` at position ``q_index`` and
    ``return_lse`` last (O as :func:`attention_outputs` makes it); returns the fake."""

    def fake(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        q, return_lse = args[q_index], args[-1]
        assert isinstance(q, torch.Tensor)
        return attention_outputs(q, bool(return_lse), contiguous_o)

    return op.register_fake(fake)  # type: ignore[attr-defined,no-any-return]


def traced_result(
    o: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    out: torch.Tensor | None,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What a traced ``run()`` returns from its op's fresh (O, LSE): O copied into ``out``
    when given (checked against ``q``), and LSE only when ``return_lse``."""
    if out is not None:
        tensors.check_data_tensor("out", out, tuple(q.shape))
        tensors.check_same_kind("out", out, "q", q)
        out.copy_(o)  # o is a new tensor: out may even alias q here
        o = out
    return (o, lse) if return_lse else o
