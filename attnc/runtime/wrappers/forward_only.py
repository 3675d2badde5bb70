"""Owns: the autograd node of attnc's eagerly launched outputs.

The kernels compute the forward pass only. An eager call launches them through ctypes,
which autograd does not see: with an input that requires grad its output used to come back
without a ``grad_fn``, so a loss built on it dropped attention's part of the gradient
without a word. Such an output now carries a node whose backward raises. Under
``torch.compile`` the custom ops, which have no autograd formula, make torch refuse to
compile a graph whose inputs require grad.

An ``out=`` buffer is written through its address, which autograd does not see either: its
version counter is bumped after the launch (as torch's own ``out=`` ops do), so a backward
that saved the buffer before raises instead of using the overwritten values, and an ``out``
that requires grad is refused while grad mode is on (torch refuses such an ``out=`` too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from attnc.runtime.planning.tensor_stamps import own_write
from attnc.runtime.tracing import compiling

F = TypeVar("F", bound=Callable[..., Any])


class _ForwardOnly(torch.autograd.Function):
    """Passes its outputs (given in a list, so not as inputs) through; backward raises."""

    @staticmethod
    def forward(ctx: Any, call: str, outputs: list[torch.Tensor], *inputs: torch.Tensor) -> Any:
        ctx.call = call
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError(
            f"attnc: {ctx.call} has no backward (its kernels compute the forward pass "
            "only); run it under torch.no_grad() or torch.inference_mode(), or pass "
            "tensors that do not require grad"
        )


def _grad_inputs(values: Any) -> list[torch.Tensor]:
    """The tensors among ``values`` (or in a tuple, list or mapping among them) that
    require grad."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                found.append(value)
        elif isinstance(value, (tuple, list, Mapping)):  # a (k, v) pair, params as a mapping
            inner = value.values() if isinstance(value, Mapping) else value
            found += [t for t in inner if isinstance(t, torch.Tensor) and t.requires_grad]
    return found


def forward_only(call: str) -> Callable[[F], F]:
    """Decorate an eager entry point named ``call`` in errors: when grad mode is on and a
    tensor argument (or one in a tuple or mapping argument; not ``out``) requires grad, it
    returns aliases of its output tensors that carry ``_ForwardOnly``'s node (an ``out=``
    buffer itself is left as it was). An ``out=`` tensor is refused when it requires grad in
    grad mode, and its version is bumped after the call. Nothing changes under
    ``torch.compile`` (torch refuses to compile the custom ops' backward; the traced ops
    return ``out``'s writes functionally) or when no input requires grad."""

    def decorate(run: F) -> F:
        @functools.wraps(run)
        def checked(*args: Any, **kwargs: Any) -> Any:
            out = kwargs.get("out")
            if not isinstance(out, torch.Tensor) or compiling():
                out = None
            elif out.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    f"{call}(): out: requires grad; a buffer the kernels write cannot take "
                    "part in autograd (pass one that does not require grad, or run under "
                    "torch.no_grad())"
                )
            if out is None:
                result = run(*args, **kwargs)
            else:
                result = _run_writing(run, out, args, kwargs)
            if not torch.is_grad_enabled():
                return result
            given = (v for k, v in kwargs.items() if k != "out")  # a buffer written, not read
            inputs = _grad_inputs(args) + _grad_inputs(given)
            if not inputs or compiling():
                return result
            # Aliases carry the node: a caller's ``out=`` buffer itself stays without one.
            outputs = [t.detach() for t in (result if isinstance(result, tuple) else (result,))]
            return _ForwardOnly.apply(call, outputs, *inputs)

        return checked  # type: ignore[return-value]

    return decorate


def _run_writing(run: Callable[..., Any], out: torch.Tensor, args: Any, kwargs: Any) -> Any:
    """``run`` with an ``out=`` buffer, whose version is bumped after the launch (written
    through its address: autograd must see a write). Planned tensor params that are views
    of the same allocation share that version counter: the bump is attnc's own write
    (``tensor_stamps.own_write``), which their stamps follow (``run()`` checked that they
    share no bytes with ``out``)."""
    result = run(*args, **kwargs)
    own_write(out, lambda: torch.autograd.graph.increment_version(out))
    return result
