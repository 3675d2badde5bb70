"""Owns: choosing the attnc variant (and its params) for one transformers attention layer.

The mapping (also in ``docs/clients.md``):

| layer setting                                   | variant                  | params          |
| ----------------------------------------------- | ------------------------ | --------------- |
| causal, nothing else (Llama, Qwen2)             | ``stdlib:causal``        | --              |
| ``softcap`` (``attn_logit_softcapping``)        | ``stdlib:softcap``       | ``cap``         |
| ``sliding_window`` (Mistral, Qwen2 windowed)    | ``stdlib:sliding_window``| ``window``      |
| ``softcap`` + ``sliding_window`` (Gemma-2 local) | ``softcap_window`` below | ``cap, window`` |
| ``alibi_slopes`` on the module (``[H_qo]``)     | ``stdlib:alibi``         | ``slopes``      |

Settings without a variant (attention sinks, dropout while training, bidirectional layers,
ALiBi combined with a window or soft-cap, ...) raise :class:`UnsupportedMaskError` naming the
setting and what attnc lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from attnc.integrations.hf_masks import UnsupportedMaskError

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
    "s_aux": "attention sinks (the sink term in the softmax denominator, gpt-oss)",
    "position_bias": "an additive position bias (T5-style relative attention)",
    "head_mask": "a per-head mask",
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

    if spec == "softcap_window":
        return attnc.load(SOFTCAP_WINDOW_SOURCE)
    return attnc.load(spec)


def layer_name(module: torch.nn.Module) -> str:
    """``ClassName (layer N)`` for messages."""
    idx = getattr(module, "layer_idx", None)
    return type(module).__name__ + ("" if idx is None else f" (layer {idx})")


def variant_for_layer(
    module: torch.nn.Module,
    *,
    dropout: float,
    sliding_window: int | None,
    softcap: float | None,
    kwargs: dict[str, Any],
) -> LayerVariant:
    """The variant for ``module`` given the keyword arguments of its attention call."""
    name = layer_name(module)
    _reject_unsupported(module, name, dropout, kwargs)
    window = None if sliding_window is None else int(sliding_window)
    if window is not None and window < 1:
        raise UnsupportedMaskError(f"{name}: sliding_window must be >= 1, got {window}")
    slopes = getattr(module, "alibi_slopes", None)
    if slopes is not None:
        if window is not None or softcap is not None:
            raise UnsupportedMaskError(
                f"{name}: ALiBi combined with sliding_window/softcap has no attnc variant"
            )
        return LayerVariant("stdlib:alibi", (("slopes", slopes),), None)
    if softcap is not None and window is not None:
        return LayerVariant("softcap_window", (("cap", float(softcap)), ("window", window)), window)
    if softcap is not None:
        return LayerVariant("stdlib:softcap", (("cap", float(softcap)),), None)
    if window is not None:
        return LayerVariant("stdlib:sliding_window", (("window", window),), window)
    return LayerVariant("stdlib:causal", (), None)


def _reject_unsupported(
    module: torch.nn.Module, name: str, dropout: float, kwargs: dict[str, Any]
) -> None:
    if getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
        raise UnsupportedMaskError(
            f"{name}: attention sinks (`sinks`, gpt-oss) need the sink term in the softmax "
            "denominator, which attnc variants cannot express yet"
        )
    for key, what in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(key) is not None:
            raise UnsupportedMaskError(f"{name}: `{key}` ({what}) has no attnc variant")
    config = getattr(module, "config", None)
    for key, what in _UNSUPPORTED_CONFIG.items():
        if getattr(config, key, None):
            raise UnsupportedMaskError(f"{name}: config `{key}` ({what}) has no attnc variant")
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        raise UnsupportedMaskError(
            f"{name}: `is_causal=False` (bidirectional attention) is not mapped to attnc"
        )
    if dropout:
        raise UnsupportedMaskError(
            f"{name}: attention dropout {dropout} (training mode) is not supported; "
            "call model.eval() or set attention_dropout=0"
        )
