"""Eager reference attention for one request, driven by a variant's emitted PyTorch code.

Shapes: q ``[q_len, H_qo, D]``, k and v ``[kv_len, H_kv, D]``; query heads are grouped onto
KV heads (GQA: ``kv_head = qo_head // (H_qo // H_kv)``); queries are aligned to the end of
the KV (``q_pos = q_idx + kv_len - q_len``). Fully masked rows give output 0 and LSE -inf.
LSE is the natural log of the softmax denominator, including the max; it is 0 for
``normalize = none`` variants.

Sinks (``sink = expr;``): the row's sink logit ``s0`` joins the denominator only,
``o = sum_j e^{s_j} v_j / (e^{s0} + sum_j e^{s_j})``, and the LSE includes it; a row that sees
no key gives output 0 and LSE ``s0`` (the output transform is not applied to it).

Batch-flattened tensor params (language v2) are given for this one request: a ``kv_len``
tensor as the request's slice (``kv_len`` entries), a ``q_len`` tensor as its ``q_len``
entries, and a ``batch_size`` tensor whole, read at ``batch`` (the request's index, the
``batch`` argument). :func:`request_params` cuts those slices from batched params.

Numerics as the kernels compute them: 16-bit inputs are widened to float32 before Q·Kᵀ
(products and sums in float32, like the tensor cores' fp32 accumulators), and everything
after runs in float32 (float64 inputs stay float64, but for the discrete decisions on f32
values, a comparison, ``int()``, ``floor``, ``ceil`` or ``%``, which the generated code takes
on binary32 values as the kernels do). A NaN score that the mask keeps (NaN in
q or k, a NaN param) makes its row's output and LSE NaN; masked-out positions are never
read, so a NaN there changes nothing. Autocast is off inside (under ``torch.autocast`` the
two einsums ran in 16 bits: errors of 1e-2 against float64 for float32 inputs).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnc.runtime.checks.params import (
    REQUEST_DIM_MEANING,
    TORCH_DTYPES,
    check_tensor_param,
    resolve_with,
)
from attnc.runtime.checks.tensors import check_int, is_dense, layout_name, sm_scale_value

if TYPE_CHECKING:  # variant.py imports this module
    from attnc.runtime.variant import Variant


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError naming the tensor for shape/dtype/device problems of one request."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not is_dense(t):
            raise ValueError(f"{name} must be a dense tensor, got a {layout_name(t)} one")
        if t.dim() != 3:
            raise ValueError(
                f"{name} must have 3 dims [len, heads, head_dim], got shape {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and k ({k.shape[2]}) differ")
    if q.shape[2] == 0:
        raise ValueError("head_dim: q, k and v have a last dim of 0 (head_dim must be >= 1)")
    hq, hk = q.shape[1], k.shape[1]
    if hq == 0 or hk == 0:
        raise ValueError(f"q and k need at least one head each, got {hq} and {hk}")
    if hq % hk != 0:
        raise ValueError(f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hk})")


def request_params(
    decls: Sequence[Any],
    params: Mapping[str, Any],
    b: int,
    q_starts: Sequence[int],
    kv_starts: Sequence[int],
) -> dict[str, Any]:
    """The params of request ``b`` from batched ones: a ``kv_len`` tensor (flattened over the
    requests) is cut to ``[kv_starts[b], kv_starts[b+1])``, a ``q_len`` tensor to
    ``[q_starts[b], q_starts[b+1])``; other values stay whole. ``decls`` are the variant's
    param declarations (``Variant.params``); the starts are cumulative lengths (batch + 1)."""
    cuts = {"kv_len": kv_starts, "q_len": q_starts}
    out = dict(params)
    for decl in decls:
        starts = cuts.get(decl.token_dim or "")
        if starts is not None and decl.name in out:
            out[decl.name] = out[decl.name][int(starts[b]) : int(starts[b + 1])]
    return out


def reference_attention(
    module: types.ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float | None,
    return_lse: bool,
    params: dict[str, Any],
    batch: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one request with the variant's score/mask/output (see module doc); the
    caller has checked the inputs with :func:`check_qkv`."""
    with _autocast_off(q.device.type):
        q_len, hq, d = q.shape
        kv_len, hk, _ = k.shape
        scale = sm_scale_value(sm_scale, d)
        ftype = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
        group = hq // hk
        kx = k.repeat_interleave(group, dim=1).to(ftype)
        vx = v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q.to(ftype), kx) * scale
        env = _environment(q, ftype, s, scale, params, batch, q_len, kv_len, hq, hk, d)
        tensors = {n: t for n, t in params.items() if isinstance(t, torch.Tensor)}
        t = module.score(env, tensors).to(ftype) if module.HAS_SCORE else s
        t = t.expand(hq, q_len, kv_len)
        visible = module.mask(env, tensors) if module.HAS_MASK else None
        if visible is not None:
            visible = visible.expand(hq, q_len, kv_len)
        sink = None
        if getattr(module, "HAS_SINK", False):
            sink = module.sink(env, tensors).to(ftype).expand(hq, q_len, 1)
        o, lse, seen = _normalise(module.USE_SOFTMAX, t, visible, vx.to(ftype), sink)
        if module.HAS_OUTPUT:
            env["out"] = o
            transformed = module.output(env, tensors).to(ftype).expand_as(o)
            # Rows without a visible key keep output 0 (softmax variants); NaN rows stay NaN.
            o = torch.where(seen.unsqueeze(-1), transformed, torch.zeros_like(o))
        out = o.permute(1, 0, 2).to(q.dtype).contiguous()
        if not return_lse:
            return out
        lse_dtype = ftype if q.dtype in (torch.float32, torch.float64) else torch.float32
        return out, lse.permute(1, 0).to(lse_dtype).contiguous()


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """A context without autocast on ``device_type`` (nothing to do where it is off, or where
    autocast does not know the device type)."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False) if enabled else contextlib.nullcontext()


def _environment(q, ftype, s, scale, params, batch, q_len, kv_len, hq, hk, d) -> dict[str, Any]:
    dev = q.device

    def ints(n: int, shape: tuple[int, int, int]) -> torch.Tensor:
        return torch.arange(n, device=dev, dtype=torch.int64).view(shape)

    def scalar(x: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=dev)

    q_idx = ints(q_len, (1, q_len, 1))
    qo_head = ints(hq, (hq, 1, 1))
    env: dict[str, Any] = {
        "score": s,
        "q_idx": q_idx,
        "q_pos": q_idx + (kv_len - q_len),
        "kv_idx": ints(kv_len, (1, 1, kv_len)),
        "qo_head": qo_head,
        "kv_head": torch.div(qo_head, hq // hk, rounding_mode="floor"),
        "sm_scale": scalar(scale, ftype),
        "q_len": scalar(q_len, torch.int64),
        "kv_len": scalar(kv_len, torch.int64),
        "batch": scalar(batch, torch.int64),
        "head_dim": scalar(d, torch.int64),
        "num_qo_heads": scalar(hq, torch.int64),
        "num_kv_heads": scalar(hk, torch.int64),
    }
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            continue
        if isinstance(value, bool):
            env[name] = scalar(value, torch.bool)
        elif isinstance(value, int):
            env[name] = scalar(value, torch.int64)
        else:
            env[name] = scalar(float(value), ftype)
    return env


def _normalise(
    use_softmax: bool,
    t: torch.Tensor,
    visible: torch.Tensor | None,
    v: torch.Tensor,
    sink: torch.Tensor | None = None,
):
    """(output [H, q, D], lse [H, q], seen [H, q]) from transformed scores ``t`` [H, q, k];
    ``sink`` [H, q, 1] is the rows' sink logit (None: no sink); ``seen`` is false for the
    softmax rows without a visible key."""
    shape = t.shape[:2]
    if not use_softmax:
        w = t if visible is None else torch.where(visible, t, torch.zeros_like(t))
        o = torch.einsum("hqk,hkd->hqd", w, v.permute(1, 0, 2))
        zeros = torch.zeros(shape, dtype=t.dtype, device=t.device)
        return o, zeros, torch.ones(shape, dtype=torch.bool, device=t.device)
    if visible is not None:
        t = t.masked_fill(~visible, float("-inf"))
    if sink is None:
        sink = torch.full((*shape, 1), float("-inf"), dtype=t.dtype, device=t.device)
    if t.shape[-1] == 0:
        o = torch.zeros(*shape, v.shape[-1], dtype=t.dtype, device=t.device)
        return o, sink.squeeze(-1).clone(), torch.zeros(shape, dtype=torch.bool, device=t.device)
    m_keys = t.amax(dim=-1, keepdim=True)
    m = torch.maximum(m_keys, sink)  # NaN in either stays NaN
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(t - m_safe)
    keys = p.sum(dim=-1, keepdim=True)
    denom = keys + torch.exp(sink - m_safe)
    o = torch.einsum("hqk,hkd->hqd", p, v.permute(1, 0, 2))
    # keys is 0 only for rows without a visible key; a NaN (a NaN score) stays NaN.
    o = torch.where(keys == 0, torch.zeros_like(o), o / denom.clamp_min(torch.finfo(t.dtype).tiny))
    lse = (m_safe + torch.log(denom)).squeeze(-1)
    return o, lse, (keys != 0).squeeze(-1)


def request_reference(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    /,
    *,
    batch: int = 0,
    sm_scale: float | None = None,
    return_lse: bool = False,
    **params: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The reference of request ``batch`` of a batch, for a loaded ``variant``: q
    ``[q_len, H_qo, D]`` and k/v ``[kv_len, H_kv, D]`` of that request, a ``kv_len`` tensor
    param as its ``kv_len`` entries, a ``q_len`` one as its ``q_len`` entries (see
    :func:`request_params`), a ``batch_size`` one whole (read at ``batch``, an int >= 0, checked
    as such: a float or bool is a ValueError naming it). Scalar params
    missing from ``params`` take their defaults; a ValueError names a param that is unknown,
    missing or of the wrong length, or a scalar or tensor the kernels refuse (in their words,
    ``checks.params.resolve_params``: a tensor of another shape or dtype, a sparse one)."""
    batch = check_int("batch", batch, 0)
    check_qkv(q, k, v)
    lengths = {"q_len": q.shape[0], "kv_len": k.shape[0]}
    sizes = {"num_qo_heads": q.shape[1], "num_kv_heads": k.shape[1], "head_dim": q.shape[2]}

    def request_tensor(p: Any, value: object, prefix: str) -> torch.Tensor:
        """Tensor param ``p`` of this request (``value``: a tensor, or what
        ``torch.as_tensor`` takes), checked as ``Variant.reference`` checks it."""
        value = _request_value(p, value, q.device, prefix)
        dim = p.token_dim
        want = lengths.get(dim or "")
        if value.dim() and want is not None and value.shape[0] != want:
            raise ValueError(
                f"{prefix}: param '{p.name}' has one value per "
                f"{'KV' if dim == 'kv_len' else 'query'} token: give this request's "
                f"{want} entries, got {value.shape[0]}"
            )
        if value.dim() and dim == "batch_size" and not 0 <= batch < value.shape[0]:
            raise ValueError(
                f"{prefix}: param '{p.name}' has one value per request "
                f"({value.shape[0]} given), but the request is batch {batch}"
            )
        given = value.shape[0] if value.dim() else batch + 1  # a batch_size tensor is whole
        own = {**sizes, **lengths, "batch_size": given}
        return check_tensor_param(p, value, prefix, own, None, REQUEST_DIM_MEANING)

    resolved = resolve_with(
        variant.params, params, variant_name=variant.name, check_tensor=request_tensor
    )
    return reference_attention(
        variant.reference_module,
        q,
        k,
        v,
        sm_scale=sm_scale,
        return_lse=return_lse,
        params=resolved,
        batch=batch,
    )


def _request_value(p: Any, value: object, device: torch.device, prefix: str) -> torch.Tensor:
    """Tensor param ``p``'s ``value`` on ``device``: a tensor in its own dtype; other data (a
    list, an array) through ``torch.as_tensor``, in the param's dtype where that changes no
    value (``[9, 2, 4]`` for an ``i32`` param; ``[0.5]`` stays float, which the check
    refuses)."""
    try:
        made = torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:  # None, a string, ragged lists
        raise ValueError(
            f"{prefix}: param '{p.name}' takes a tensor (or what torch.as_tensor takes), "
            f"got {type(value).__name__}: {exc}"
        ) from None
    want = TORCH_DTYPES[p.dtype]
    if isinstance(value, torch.Tensor) or made.dtype in (want, torch.bool) or made.is_complex():
        return made
    cast = made.to(want)
    return cast if torch.equal(cast.to(made.dtype), made) else made
