"""Runtime parameter checking: keyword arguments -> a complete, validated value per param.

Every problem is a ``ValueError`` that names the variant and the param. Values are never
converted silently (a float16 tensor for a ``tensor<f32>`` param is an error, not a cast).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from attnc.compiler.ir import ParamDecl
from attnc.dsl.errors import printable
from attnc.dsl.limits import I32_MAX, I32_MIN
from attnc.dsl.literals import F32_OVERFLOW
from attnc.runtime.checks.tensors import (
    NEGATIVE_BIT,
    check_param_memory,
    is_dense,
    layout_name,
    negated_view,
)

TORCH_DTYPES = {"f32": torch.float32, "i32": torch.int32}  # a tensor param's, by declared name
# What a size of a tensor param's shape stands for, in a shape error: of a batch (the
# wrappers, Variant.reference), and of one request of a batch (reference.request_reference).
BATCH_DIM_MEANING = {
    "kv_len": "sum of kv_len over the batch",
    "q_len": "sum of q_len over the batch",
    "batch_size": "requests in the batch",
}
REQUEST_DIM_MEANING = {
    "kv_len": "this request's KV tokens",
    "q_len": "this request's query tokens",
    "batch_size": "requests in the batch",
}


def token_sizes(total_q: int, total_kv: int, batch: int) -> dict[str, int]:
    """Sizes of the batch-sized tensor dims: ``q_len`` = total query tokens, ``kv_len`` =
    total KV tokens (both flattened over requests), ``batch_size`` = requests."""
    return {"q_len": int(total_q), "kv_len": int(total_kv), "batch_size": int(batch)}


def declared_shape(decl: ParamDecl, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape a tensor param declares: its int dims as written, its named ones (heads,
    ``head_dim``, the batch's sizes: :func:`token_sizes`) from ``sizes``; a ``KeyError`` for
    a name not there."""
    return tuple(d if isinstance(d, int) else sizes[d] for d in decl.dims)


def describe_decl(decl: ParamDecl) -> str:
    """The declared type as written in `.attn` text, e.g. ``i32`` or
    ``tensor<f32>[num_qo_heads]`` (:meth:`ParamDecl.type_text`)."""
    return decl.type_text()


def resolve_params(
    decls: Sequence[ParamDecl],
    kwargs: Mapping[str, object],
    *,
    variant_name: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device | str | None = None,
    batch_sizes: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """Check ``kwargs`` against ``decls`` and return one value per param, in declaration order.

    Defaults fill missing optional params. Scalars come back as ``float``/``int``/``bool``;
    tensors come back contiguous. ``device``, when given, is the device tensors must be on.
    ``batch_sizes`` (``token_sizes``) gives the sizes of the ``kv_len``/``q_len``/
    ``batch_size`` dims; a tensor with such a dim is refused without it.
    """
    sizes = {"num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    sizes.update(batch_sizes or {})

    def check_tensor(decl: ParamDecl, value: object, prefix: str) -> object:
        return check_tensor_param(decl, value, prefix, sizes, device)

    return resolve_with(decls, kwargs, variant_name=variant_name, check_tensor=check_tensor)


# Checks a tensor param's value given as (declaration, value, error prefix); returns its value.
TensorCheck = Callable[[ParamDecl, object, str], object]


def resolve_with(
    decls: Sequence[ParamDecl],
    kwargs: Mapping[str, object],
    *,
    variant_name: str,
    check_tensor: TensorCheck,
) -> dict[str, object]:
    """``resolve_params`` with ``check_tensor`` for the tensors given: unknown params refused
    (with a did-you-mean), missing ones at their default (refused without one), scalars
    checked and converted, in declaration order."""
    prefix = f"variant '{variant_name}'"
    _reject_unknown(decls, kwargs, prefix)
    resolved: dict[str, object] = {}
    for decl in decls:
        if decl.name not in kwargs:
            if decl.default is None:
                raise ValueError(f"{prefix}: missing param '{decl.name}' ({describe_decl(decl)})")
            resolved[decl.name] = _check_scalar(decl, decl.default, prefix)
        elif decl.kind == "tensor":
            resolved[decl.name] = check_tensor(decl, kwargs[decl.name], prefix)
        else:
            resolved[decl.name] = _check_scalar(decl, kwargs[decl.name], prefix)
    return resolved


def check_variant(variant: object) -> None:
    """A wrapper's ``variant``: a compiled variant (``attnc.load``), not its name or source
    (a ``TypeError`` naming the argument otherwise)."""
    from attnc.runtime.variant import Variant  # variant.py imports this module

    if not isinstance(variant, Variant):
        raise TypeError(
            f"variant: expected a variant from attnc.load(), got {_type_name(variant)} "
            f"{printable(repr(variant))[:80]}"
        )


def check_params_arg(params: object) -> Mapping[str, object]:
    """``plan()``'s ``params`` argument: None (no params, ``{}``) or a mapping of param names
    to values (a ``TypeError`` otherwise; unknown names are refused by the param checks), whose
    tensors have memory to read (``check_param_memory``: the plan reads them). A mapping other
    than a plain dict is read once, into a dict the plan reads from then on: its ``items()``
    and ``[]`` could give different values (the checks read one, the plan the other)."""
    if params is None:
        return {}
    if type(params) is dict:
        check_param_memory(params)
        return params
    if isinstance(params, Mapping):
        try:
            read = dict(params.items())
        except Exception as exc:  # caller code: any failure is its own
            raise TypeError(
                f"params: its items could not be read ({type(exc).__name__}: {printable(str(exc))})"
            ) from None
        check_param_memory(read)
        return read
    raise TypeError(
        f"params: expected a mapping of param names to values, got {type(params).__name__}"
    )


def check_plan_params(
    decls: Sequence[ParamDecl], kwargs: Mapping[str, object], *, variant_name: str
) -> dict[str, object]:
    """Check the scalar param values given to ``plan()`` (a subset; tensors belong to ``run()``)
    and return them converted as ``resolve_params`` would."""
    prefix = f"variant '{variant_name}'"
    _reject_unknown(decls, kwargs, prefix)
    checked: dict[str, object] = {}
    for decl in decls:
        if decl.name not in kwargs:
            continue
        if decl.kind == "tensor":
            raise ValueError(
                f"{_where(prefix, decl)}: plan() takes scalar params only; pass tensors to run()"
            )
        checked[decl.name] = _check_scalar(decl, kwargs[decl.name], prefix)
    return checked


def _reject_unknown(decls: Sequence[ParamDecl], kwargs: Mapping[str, object], prefix: str) -> None:
    names = [d.name for d in decls]
    for key in kwargs:
        if key in names:
            continue
        msg = f"{prefix}: unknown param '{printable(str(key))}'"
        close = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) else []
        if close:
            msg += f"; did you mean '{close[0]}'?"
        elif names:
            msg += f"; params are: {', '.join(names)}"
        else:
            msg += "; this variant takes no params"
        raise ValueError(msg)


def _type_name(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor ({value.dtype})"
    return type(value).__name__


def _where(prefix: str, decl: ParamDecl) -> str:
    """How an error names the param (built only when there is an error)."""
    return f"{prefix}: param '{decl.name}' ({describe_decl(decl)})"


def _check_scalar(decl: ParamDecl, value: object, prefix: str) -> object:
    if decl.kind == "tensor":
        raise ValueError(f"{_where(prefix, decl)}: has a default, but tensor params cannot")
    if decl.dtype == "bool":
        if isinstance(value, bool | np.bool_):  # numpy's as Python's (as its ints and floats)
            return bool(value)
        raise ValueError(f"{_where(prefix, decl)}: expected a bool, got {_type_name(value)}")
    is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if decl.dtype == "i32":
        if not is_int:
            raise ValueError(f"{_where(prefix, decl)}: expected an int, got {_type_name(value)}")
        ivalue = int(value)  # type: ignore[call-overload]
        if not I32_MIN <= ivalue <= I32_MAX:
            raise ValueError(f"{_where(prefix, decl)}: {_int_text(ivalue)} does not fit in int32")
        return ivalue
    if is_int or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        try:
            fvalue = float(value)  # type: ignore[arg-type]
        except OverflowError:
            fvalue = math.inf
        if abs(fvalue) >= F32_OVERFLOW and not (math.isinf(fvalue) and fvalue == value):
            raise ValueError(
                f"{_where(prefix, decl)}: value out of the float range "
                "(f32 would round it to inf; pass inf itself to mean inf)"
            )
        return fvalue
    raise ValueError(f"{_where(prefix, decl)}: expected a float, got {_type_name(value)}")


def _int_text(value: int) -> str:
    """``value N`` for an error message; the bit length of an int too long to print."""
    if value.bit_length() > 256:
        return f"an int of {value.bit_length()} bits"
    return f"value {value}"


def check_tensor_param(
    decl: ParamDecl,
    value: object,
    prefix: str,
    sizes: Mapping[str, int],
    device: torch.device | str | None,
    dim_meaning: Mapping[str, str] = BATCH_DIM_MEANING,
) -> torch.Tensor:
    """Tensor param ``decl``'s ``value``, contiguous: a dense ``torch.Tensor`` of the declared
    shape (:func:`declared_shape` with ``sizes``) and dtype (:data:`TORCH_DTYPES`, no casts),
    on ``device`` when one is given; any other is a ``ValueError`` naming the param (its
    message begins with ``prefix``; a shape error says what each token or batch size stands
    for by ``dim_meaning``)."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"{_where(prefix, decl)}: expected a torch.Tensor, got {_type_name(value)}"
        )
    if not is_dense(value):
        raise ValueError(
            f"{_where(prefix, decl)}: expected a dense tensor, got a {layout_name(value)} one"
        )
    if negated_view(value):
        raise ValueError(f"{_where(prefix, decl)}: {NEGATIVE_BIT}")
    unknown = [d for d in decl.dims if not isinstance(d, int) and d not in sizes]
    if unknown:
        raise ValueError(
            f"{_where(prefix, decl)}: its size ({unknown[0]}) comes from the batch, which is "
            "not known here"
        )
    shape = declared_shape(decl, sizes)
    if tuple(value.shape) != shape:
        meaning = [
            f"{d} = {dim_meaning[d]}" for d in decl.dims if isinstance(d, str) and d in dim_meaning
        ]
        why = f" ({', '.join(meaning)})" if meaning else ""
        raise ValueError(
            f"{_where(prefix, decl)}: expected shape {list(shape)}{why}, got {list(value.shape)}"
        )
    if value.numel() > I32_MAX:  # the kernels index tensor params with 32-bit ints
        raise ValueError(
            f"{_where(prefix, decl)}: {value.numel()} elements, more than the kernels index "
            f"(at most {I32_MAX})"
        )
    want = TORCH_DTYPES[decl.dtype]
    if value.dtype != want:
        raise ValueError(
            f"{_where(prefix, decl)}: expected dtype {want}, got {value.dtype} (no implicit casts)"
        )
    if device is not None and not same_device(value.device, torch.device(device)):
        raise ValueError(
            f"{_where(prefix, decl)}: tensor is on {value.device}, expected {torch.device(device)}"
        )
    return value.contiguous()


def same_device(a: torch.device, b: torch.device) -> bool:
    """True when ``a`` and ``b`` name the same device (a missing index matches any index)."""
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index
