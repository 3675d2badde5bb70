"""Run in a fresh process by the jit suite: time a first call and print one JSON line.

``python -m benchmarks.jit_child attnc|flex``: attnc times ``attnc.load`` plus the first
prefill call (any build included); flex times compiling and running FlexAttention once.
CUDA is initialised and inputs are made before the clock starts.
"""

from __future__ import annotations

import json
import sys
import time

PROBE_SOURCE = """
variant jit_probe {
    doc "soft-capped causal attention, defined in the benchmark (not a stdlib name)";
    param cap: f32 = 30.0;
    score = cap * tanh(score / cap);
    mask = kv_idx <= q_pos;
}
"""


def _inputs():
    import torch

    torch.cuda.init()
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(1024, 32, 128), (1024, 8, 128), (1024, 8, 128)]
    q, k, v = (torch.randn(s, generator=gen, device="cuda", dtype=torch.bfloat16) for s in shapes)
    torch.cuda.synchronize()
    return q, k, v


def time_attnc() -> dict:
    """Seconds for import, ``attnc.load`` of a variant given as text, and its first call."""
    import torch

    q, k, v = _inputs()
    t0 = time.perf_counter()
    import attnc

    t1 = time.perf_counter()
    variant = attnc.load(PROBE_SOURCE)
    t2 = time.perf_counter()
    variant.prefill(q, k, v, cap=30.0)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "load_s": t2 - t1, "first_call_s": t3 - t2, "total_s": t3 - t1}


def time_flex() -> dict:
    """Seconds to compile and run soft-capped causal FlexAttention once."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in _inputs())
    t1 = time.perf_counter()
    fn = torch.compile(flex_attention, dynamic=False)
    mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, 1024, 1024, device="cuda")
    fn(
        q,
        k,
        v,
        score_mod=lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0),
        block_mask=mask,
        enable_gqa=True,
    )
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"total_s": t2 - t1}


def main(argv: list[str]) -> int:
    """Print {"total_s": ...} or {"error": ...} as the last line."""
    which = argv[0] if argv else "attnc"
    try:
        result = time_attnc() if which == "attnc" else time_flex()
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        result = {"error": f"{type(exc).__name__}: {msg[0] if msg else ''}"[:120]}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
