"""Owns: choosing the attnc variant (and its params) for one transformers attention layer.

The mapping (also in ``docs/clients.md``):

| layer setting                                   | variant                  | params          |
| ----------------------------------------------- | ------------------------ | --------------- |
| causal, nothing else (Llama, Qwen2)             | ``stdlib:causal``        | --              |
| ``softcap`` (``attn_logit_softcapping``)        | ``stdlib:softcap``       | ``cap``         |
| ``sliding_window`` (Mistral, Qwen2 windowed)    | ``stdlib:sliding_window``| ``window``      |
| ``softcap`` + ``sliding_window`` (Gemma-2 local) | ``softcap_window`` below | ``cap, window`` |
| ``alibi_slopes`` on the module (``[H_qo]``)     | ``stdlib:alibi``         | ``slopes``      |
| ``sinks`` / ``s_aux`` (gpt-oss full layers)     | ``sink_causal``          | ``sinks``       |
| ``sinks`` + ``sliding_window`` (gpt-oss local)  | ``sink_window``          | ``sinks, window`` |

Sinks need the language's ``sink = ...;``; without it (or with a reference that ignores it)
the first layer with sinks raises :class:`UnsupportedMaskError` saying what is missing
(:mod:`attnc.integrations.hf_sinks`). Settings without a variant (dropout while training,
bidirectional and cross-attention layers, chunked attention, sinks or ALiBi combined with soft-cap,
ALiBi with a window, ...) raise :class:`UnsupportedMaskError` naming the setting and what attnc
lacks.
"""

from __future__ import annotations

import math
import operator
import weakref
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from attnc.dsl.errors import printable
from attnc.integrations.hf_masks import UnsupportedMaskError
from attnc.integrations.hf_sinks import SINK_SOURCES, sink_spec, sink_support_gap
from attnc.runtime.checks.tensors import is_bool_value, shown_value

# Gemma-2's local layers: soft-capped logits over a causal sliding window. The standard
# library has each half; this combines them.
SOFTCAP_WINDOW_SOURCE = """
variant softcap_window {
    doc "Soft-capped logits (cap * tanh(score / cap)) over a causal sliding window";
    param cap: f32;
    param window: i32;
    score = cap * tanh(score / cap);
    mask = kv_idx <= q_pos && q_pos - kv_idx < window;
}
"""

# Keyword arguments transformers passes that change the result and that no variant expresses.
_UNSUPPORTED_KWARGS = {
    "position_bias": "an additive position bias (T5-style relative attention)",
    "head_mask": "a per-head mask",
    "indices": "a top-k selection of keys per query (DeepSeek-V3.2-style sparse attention)",
    "block_indices": "a selection of key blocks per query (block-sparse attention)",
}


# Attention settings of configs that change the attention, with what attnc lacks for them.
_UNSUPPORTED_CONFIG = {
    "attention_chunk_size": "chunked attention (keys grouped into fixed chunks)",
    "use_bidirectional_attention": "bidirectional attention in a decoder",
}


@dataclass(frozen=True)
class LayerVariant:
    """The variant of one layer with its run-time params and the scalar params its mask
    bounds read (given to ``plan()`` as well)."""

    spec: str
    params: tuple[tuple[str, Any], ...]
    window: int | None

    @property
    def variant(self) -> Any:
        """The compiled variant (loaded once per spec)."""
        return _load(self.spec)

    def run_params(self) -> dict[str, Any]:
        """Keyword params for ``reference`` / ``run``."""
        return dict(self.params)

    def plan_params(self) -> dict[str, Any]:
        """The scalar params the mask bounds read (``window``)."""
        return {} if self.window is None else {"window": self.window}


@cache
def _load(spec: str) -> Any:
    import attnc

    sources = {"softcap_window": SOFTCAP_WINDOW_SOURCE, **SINK_SOURCES}
    return attnc.load(sources.get(spec, spec))


def layer_name(module: torch.nn.Module) -> str:
    """``ClassName (layer N)`` for messages."""
    idx = getattr(module, "layer_idx", None)
    return printable(type(module).__name__ + ("" if idx is None else f" (layer {idx})"))


@dataclass(frozen=True)
class LayerCall:
    """One attention call of a layer: the module and the settings its call carries."""

    module: torch.nn.Module
    dropout: float
    sliding_window: int | None
    softcap: float | None
    kwargs: dict[str, Any]


def variant_for_layer(
    module: torch.nn.Module,
    *,
    dropout: float,
    sliding_window: int | None,
    softcap: float | None,
    kwargs: dict[str, Any],
) -> LayerVariant:
    """The variant for ``module`` given the keyword arguments of its attention call.

    Decided once per layer and call settings (every decode step asks again): a layer whose
    call carries tensors (sinks, ALiBi slopes, biases) is decided afresh each time."""
    _refuse_unsupported_kwargs(module, kwargs)
    call = LayerCall(module, dropout, sliding_window, softcap, kwargs)
    key = _settings_key(call)
    if key is not None:
        hit = _chosen.get(module)
        if hit is not None and hit[0] == key:
            return hit[1]
    choice = _choose(call)
    if key is not None:
        _chosen[module] = (key, choice)
    return choice


_chosen: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[Any, ...], LayerVariant]] = (
    weakref.WeakKeyDictionary()
)
_TENSOR_KWARGS = ("s_aux", "sinks", "position_bias", "head_mask", "cu_seq_lens_q", "cu_seq_lens_k")


def _refuse_unsupported_kwargs(module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """Refuse a call that carries a keyword argument the backend cannot apply and that
    changes the result (:data:`_UNSUPPORTED_KWARGS`), before any remembered choice is reused
    (the choice is keyed by settings, not tensors). Other arguments are ignored, as
    transformers' eager and sdpa attention ignore them (``token_type_ids`` from a
    tokenizer's batch reaches every layer)."""
    for key, what in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(key) is not None:
            raise UnsupportedMaskError(
                f"{layer_name(module)}: `{key}` ({what}) has no attnc variant; ignoring it "
                "would compute another attention"
            )


def _settings_key(call: LayerCall) -> tuple[Any, ...] | None:
    """What the choice depends on, or None when it depends on tensors."""
    if any(call.kwargs.get(k) is not None for k in _TENSOR_KWARGS):
        return None
    module = call.module  # read as the choice reads it: a property or class attribute too
    if any(getattr(module, name, None) is not None for name in ("sinks", "alibi_slopes")):
        return None
    # Each value with its type: True == 1 and 1.0 == 1, but the checks refuse a bool window or
    # cap that an int or a float of the same value passes. Every attribute the choice reads is
    # here by value (a config or module changed in place is decided again); a tensor setting
    # (its values may change in place) is decided afresh each call.
    config = getattr(module, "config", None)
    settings = (
        call.dropout,
        call.sliding_window,
        call.softcap,
        call.kwargs.get("is_causal"),
        getattr(module, "is_causal", True),
        getattr(module, "is_cross_attention", False),
        *(getattr(config, k, None) for k in _UNSUPPORTED_CONFIG),
    )
    if any(isinstance(s, torch.Tensor) for s in settings):
        return None
    return (*((type(s), s) for s in settings), id(config))


def _choose(call: LayerCall) -> LayerVariant:
    module, kwargs = call.module, call.kwargs
    name = layer_name(module)
    _reject_unsupported(module, name, call.dropout, kwargs)
    window = _window(name, call.sliding_window)
    softcap = _softcap(name, call.softcap)
    slopes = getattr(module, "alibi_slopes", None)
    sinks = _sinks(name, kwargs, module)
    if sinks is not None:
        return _sink_variant(name, sinks, window, softcap is not None or slopes is not None)
    if slopes is not None:
        if window is not None or softcap is not None:
            raise UnsupportedMaskError(
                f"{name}: ALiBi combined with sliding_window/softcap has no attnc variant"
            )
        return LayerVariant("stdlib:alibi", (("slopes", _slopes(name, slopes)),), None)
    if softcap is not None and window is not None:
        return LayerVariant("softcap_window", (("cap", softcap), ("window", window)), window)
    if softcap is not None:
        return LayerVariant("stdlib:softcap", (("cap", softcap),), None)
    if window is not None:
        return LayerVariant("stdlib:sliding_window", (("window", window),), window)
    return LayerVariant("stdlib:causal", (), None)


def _sinks(name: str, kwargs: dict[str, Any], module: torch.nn.Module) -> Any:
    """The layer's sink logits: ``s_aux`` (gpt-oss), ``sinks`` (the same, by its other name;
    both at once must be one tensor), else the module's ``sinks``; None without."""
    given = [kwargs[k] for k in ("s_aux", "sinks") if kwargs.get(k) is not None]
    if len(given) == 2 and given[0] is not given[1]:
        raise UnsupportedMaskError(f"{name}: both `s_aux` and `sinks` given: pass one of them")
    return given[0] if given else getattr(module, "sinks", None)


def _slopes(name: str, slopes: Any) -> torch.Tensor:
    """ALiBi's slopes as the variant's f32 vector (a model cast to bf16 casts them too)."""
    if not isinstance(slopes, torch.Tensor) or not slopes.is_floating_point():
        raise UnsupportedMaskError(
            f"{name}: alibi_slopes: expected a float tensor [num_heads], got {shown_value(slopes)}"
        )
    return slopes if slopes.dtype == torch.float32 else slopes.detach().float()


def _window(name: str, value: Any) -> int | None:
    """The layer's ``sliding_window`` as a whole number of keys >= 1 (None: no window)."""
    if value is None:
        return None
    window = None
    if not isinstance(value, str) and not is_bool_value(value):
        try:
            window = operator.index(value)  # int, NumPy and 0-d integer tensors
        except TypeError:
            if isinstance(value, float) and value.is_integer():
                window = int(value)
    if window is None or window < 1:
        raise UnsupportedMaskError(
            f"{name}: sliding_window must be a whole number of keys >= 1, got {shown_value(value)}"
        )
    return window


def _softcap(name: str, value: Any) -> float | None:
    """The layer's ``softcap`` as a finite nonzero float (None: no soft-cap). A string or a
    bool is refused, not read as a number. A negative cap gives the same logits as its
    magnitude (``cap * tanh(score / cap)`` is even in ``cap``) and is passed as given."""
    if value is None:
        return None
    cap = None
    if not isinstance(value, (str, bytes)) and not is_bool_value(value):
        try:
            cap = float(value)  # int, float, NumPy and one-element tensors
        except (TypeError, ValueError, RuntimeError):
            cap = None
    if cap is None or not (math.isfinite(cap) and cap != 0.0):
        raise UnsupportedMaskError(
            f"{name}: softcap must be a finite nonzero number, got {shown_value(value)}"
        )
    return cap


def _sink_variant(name: str, sinks: torch.Tensor, window: int | None, biased: bool) -> LayerVariant:
    """gpt-oss's layers: a per-head sink logit, causal or over a sliding window."""
    if not isinstance(sinks, torch.Tensor):
        raise UnsupportedMaskError(
            f"{name}: sinks (`s_aux`): expected a tensor [num_heads], got {type(sinks).__name__}"
        )
    if biased:
        raise UnsupportedMaskError(
            f"{name}: attention sinks combined with softcap or ALiBi have no attnc variant"
        )
    gap = sink_support_gap()
    if gap is not None:
        raise UnsupportedMaskError(
            f"{name}: attention sinks (`sinks`, gpt-oss) need the sink term in the softmax "
            f"denominator (the language's `sink = ...;`): {gap}"
        )
    params: tuple[tuple[str, Any], ...] = (("sinks", sinks.detach().float().reshape(-1)),)
    if window is not None:
        params += (("window", window),)
    return LayerVariant(sink_spec(window), params, window)


def _reject_unsupported(
    module: torch.nn.Module, name: str, dropout: float, kwargs: dict[str, Any]
) -> None:
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        bounds = kwargs.get(key)
        if isinstance(bounds, torch.Tensor) and bounds.numel() > 2:
            raise UnsupportedMaskError(
                f"{name}: `{key}` describes {bounds.numel() - 1} packed sequences; attnc maps "
                "each batch row onto one sequence (packed sequences are not supported)"
            )
    config = getattr(module, "config", None)
    for key, what in _UNSUPPORTED_CONFIG.items():
        if getattr(config, key, None):
            raise UnsupportedMaskError(f"{name}: config `{key}` ({what}) has no attnc variant")
    if getattr(module, "is_cross_attention", False) or "CrossAttention" in type(module).__name__:
        raise UnsupportedMaskError(
            f"{name}: cross-attention (keys of another sequence, e.g. image tokens) is not "
            "mapped to attnc: its variants attend a request's own keys causally"
        )
    # Any false value asks for bidirectional attention (0, numpy's or a tensor's False too).
    is_causal = kwargs.get("is_causal")
    if isinstance(is_causal, torch.Tensor) and is_causal.numel() != 1:
        raise UnsupportedMaskError(
            f"{name}: is_causal: expected one value, got a tensor of shape {tuple(is_causal.shape)}"
        )
    if not getattr(module, "is_causal", True) or (is_causal is not None and not bool(is_causal)):
        raise UnsupportedMaskError(
            f"{name}: `is_causal=False` (bidirectional attention) is not mapped to attnc"
        )
    if dropout:
        raise UnsupportedMaskError(
            f"{name}: attention dropout {shown_value(dropout)} (training mode) is not supported; "
            "call model.eval() or set attention_dropout=0"
        )
