"""Owns: the attention-sink variants of the transformers backend (gpt-oss) and the check that
the installed attnc supports the language's ``sink = ...;``.

gpt-oss adds one learned logit per query head (``module.sinks``, passed as ``s_aux``) to the
denominator of every row's softmax, on its full and on its sliding-window layers. The two
variants below say so with ``sink = sinks[qo_head];``. Before the first layer with sinks
runs, :func:`sink_support_gap` checks that this attnc compiles such a variant and that its
reference applies the sink (one key of score 0 next to a sink of 0 must weigh 1/2); a gap is
reported in words instead of a wrong answer.
"""

from __future__ import annotations

from functools import cache

import torch

SINK_CAUSAL_SOURCE = """
variant sink_causal {
    doc "Causal attention with a learned per-head sink logit in the softmax denominator";
    param sinks: tensor<f32>[num_qo_heads];
    sink = sinks[qo_head];
    mask = kv_idx <= q_pos;
}
"""

SINK_WINDOW_SOURCE = """
variant sink_window {
    doc "A causal sliding window with a learned per-head sink logit in the softmax denominator";
    param sinks: tensor<f32>[num_qo_heads];
    param window: i32;
    sink = sinks[qo_head];
    mask = kv_idx <= q_pos && q_pos - kv_idx < window;
}
"""

SINK_SOURCES = {"sink_causal": SINK_CAUSAL_SOURCE, "sink_window": SINK_WINDOW_SOURCE}


@cache
def sink_support_gap() -> str | None:
    """What the installed attnc lacks for sinks, in words (None: nothing)."""
    import attnc

    try:
        variant = attnc.load(SINK_CAUSAL_SOURCE)
    except Exception as exc:  # an attnc whose language has no sinks fails to parse or lower
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return f"this attnc does not compile `sink = ...;` ({first})"
    q = torch.zeros(1, 1, 8, dtype=torch.float32, device="cpu")
    v = torch.ones(1, 1, 8, dtype=torch.float32, device="cpu")
    try:
        out = variant.reference(q, q, v, sinks=torch.zeros(1, dtype=torch.float32, device="cpu"))
    except Exception as exc:
        return f"this attnc's reference fails on a sink ({type(exc).__name__}: {exc})"
    if not torch.allclose(out.float(), 0.5 * v, atol=1e-6):
        return "this attnc parses `sink = ...;` but its reference does not apply it yet"
    return None


def sink_spec(window: int | None) -> str:
    """The variant of a layer with sinks: over a sliding window or causal."""
    return "sink_causal" if window is None else "sink_window"


_kernel_gaps: dict[tuple[str, torch.dtype, int], str | None] = {}


def sink_kernel_gap(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """What this attnc's CUDA kernels lack for sinks on ``device`` (None: nothing). Probes
    the prefill and the decode kernel once per device, dtype and head_dim: one key of score
    0 next to a sink of 0 must weigh 1/2."""
    key = (str(device), dtype, head_dim)
    if key not in _kernel_gaps:
        try:
            _kernel_gaps[key] = _probe_kernels(device, dtype, head_dim)
        except Exception as exc:  # a kernel build or launch that refuses sinks
            _kernel_gaps[key] = f"its kernels fail on a sink ({type(exc).__name__}: {exc})"
    return _kernel_gaps[key]


def _probe_kernels(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    import attnc

    variant = attnc.load(SINK_CAUSAL_SOURCE)
    q = torch.zeros(1, 1, head_dim, dtype=dtype, device=device)
    v = torch.ones(1, 1, head_dim, dtype=dtype, device=device)
    sinks = torch.zeros(1, dtype=torch.float32, device=device)
    prefill = variant.prefill(q, q, v, sinks=sinks)
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device=device)
    wrapper = attnc.BatchDecodeWrapper(variant, workspace, "HND")
    indptr, page_ids, last_len = (
        torch.tensor(ids, dtype=torch.int32, device="cpu") for ids in ([0, 1], [0], [1])
    )
    wrapper.plan(indptr, page_ids, last_len, 1, 1, head_dim, 1, dtype=dtype)
    cache = torch.stack([q, v], dim=1).view(1, 2, 1, 1, head_dim)
    decode = wrapper.run(q, cache, sinks=sinks)
    for name, out in (("prefill", prefill), ("decode", decode)):
        if not torch.allclose(out.float(), 0.5 * v.float(), atol=1e-2):
            return f"its {name} kernel does not apply the sink yet"
    return None
