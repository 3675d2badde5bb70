"""FlexAttention (torch.compile'd) as an anchor: block mask from the mask, score_mod if any.

Two prefill columns: ``flex`` (the default Triton backend) and ``flex_flash``
(``kernel_options={"BACKEND": "FLASH"}``: Inductor lowers score_mod / mask_mod to FA4's CuTe
DSL kernel, so it needs flash-attn-4 importable and runs in the anchor child process next to
FA4, see ``child_server.py``).
"""

from __future__ import annotations

from benchmarks.outcome import Missing, Unsupported
from benchmarks.system import Prepared, System
from benchmarks.workloads import Mask

_COMPILED: dict[bool, object] = {}
FLASH_OPTIONS = {"BACKEND": "FLASH"}
# One score_mod / block mask object per row shape, reused across the rotated input sets and
# rows of the same shape, so the compiled FlexAttention is specialised (and compiled) once
# per shape and mod rather than once per freshly made closure.
_SCORE_MODS: dict[tuple, object] = {}
_BLOCK_MASKS: dict[tuple, object] = {}


def compiled_flex(autotune: bool = False):
    """``torch.compile(flex_attention)``; ``max-autotune-no-cudagraphs`` with ``autotune``."""
    if autotune not in _COMPILED:
        try:
            import torch
            from torch.nn.attention.flex_attention import flex_attention
        except Exception as exc:
            raise Missing(f"flex_attention: {type(exc).__name__}") from exc
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
        mode = "max-autotune-no-cudagraphs" if autotune else None
        _COMPILED[autotune] = torch.compile(flex_attention, dynamic=False, mode=mode)
    return _COMPILED[autotune]


def mask_mod(mask: Mask, offset: int):
    """A FlexAttention mask_mod for ``mask`` with q_pos = q_idx + offset; None for no mask."""
    if mask.kind == "none":
        return None
    if mask.kind == "causal":
        return lambda b, h, q, k: k <= q + offset
    if mask.kind == "window":
        w = mask.window
        return lambda b, h, q, k: (k <= q + offset) & (q + offset - k < w)
    if mask.kind == "prefix":
        p = mask.prefix
        return lambda b, h, q, k: (k <= q + offset) | (k < p)
    raise Unsupported(f"mask {mask.kind}")


def cached_score_mod(stdlib: str, params: dict, offset: int):
    """``score_mod``, made once per (variant, scalar params, offset, head count)."""
    scalars = tuple(sorted((k, v) for k, v in params.items() if isinstance(v, (int, float))))
    heads = tuple(getattr(v, "shape", ()) for v in params.values())
    key = (stdlib, scalars, offset, heads)
    if key not in _SCORE_MODS:
        _SCORE_MODS[key] = score_mod(stdlib, params, offset)
    return _SCORE_MODS[key]


def cached_block_mask(mask: Mask, q_len: int, kv_len: int):
    """``block_mask`` on the GPU, made once per (mask, q_len, kv_len)."""
    key = (mask, q_len, kv_len)
    if key not in _BLOCK_MASKS:
        _BLOCK_MASKS[key] = block_mask(mask, q_len, kv_len)
    return _BLOCK_MASKS[key]


def score_mod(stdlib: str, params: dict, offset: int):
    """A FlexAttention score_mod for the variant's score; None when the score is plain."""
    import torch

    if stdlib in ("causal", "vanilla", "sliding_window", "prefix_lm"):
        return None
    if stdlib == "softcap":
        cap = float(params["cap"])
        return lambda s, b, h, q, k: cap * torch.tanh(s / cap)
    if stdlib == "alibi":
        slopes = params["slopes"]
        return lambda s, b, h, q, k: s + slopes[h] * (k - q - offset)
    raise Unsupported("not expressible")


def block_mask(mask: Mask, q_len: int, kv_len: int, device: str = "cuda"):
    """The block mask for one request (None when every pair is kept)."""
    from torch.nn.attention.flex_attention import create_block_mask

    fn = mask_mod(mask, kv_len - q_len)
    if fn is None:
        return None
    return create_block_mask(fn, None, None, q_len, kv_len, device=device)


def flash_backend_call(case) -> None:
    """Raise Unsupported when the FLASH backend cannot express the row (pure Python; the
    same score_mods and masks as the Triton backend)."""
    if case.variant.stdlib not in ("causal", "softcap", "alibi", "sliding_window", "prefix_lm"):
        raise Unsupported("not expressible")


class FlexPrefill(System):
    """FlexAttention on one request, inputs transposed to [1, H, L, D] outside the timing;
    ``flash=True``: the FLASH backend (FA4 kernels), named ``flex_flash``."""

    name = "flex"

    def __init__(self, autotune: bool = False, flash: bool = False):
        self.autotune = autotune
        self.flash = flash
        if flash:
            self.name = "flex_flash"

    def prepare(self, case, data) -> Prepared:
        """Build score_mod, block mask and the [1, H, L, D] copies."""
        if self.flash:
            flash_backend_call(case)
        offset = case.kv_len - case.q_len
        smod = cached_score_mod(case.variant.stdlib, data.params, offset)
        fn = compiled_flex(self.autotune)
        bm = cached_block_mask(case.variant.mask, case.q_len, case.kv_len)
        q, k, v = (t.transpose(0, 1).contiguous().unsqueeze(0) for t in (data.q, data.k, data.v))
        gqa = case.num_qo_heads != case.num_kv_heads
        extra = {"kernel_options": dict(FLASH_OPTIONS)} if self.flash else {}

        def run():
            return fn(q, k, v, score_mod=smod, block_mask=bm, enable_gqa=gqa, **extra)

        return Prepared(run, canon=lambda o: o[0].transpose(0, 1))


class FlexDecode(System):
    """FlexAttention decode over dense [B, H_kv, L, D] K/V (equal lengths only)."""

    name = "flex"
    graph = True

    def __init__(self, autotune: bool = False):
        self.autotune = autotune

    def prepare(self, case, data) -> Prepared:
        """q as [B, H, 1, D]; dense K/V gathered from the pages beforehand."""
        if data.dense_k is None:
            raise Unsupported("ragged lengths")
        kv_len = data.kv_lens[0]
        smod = cached_score_mod(case.variant.stdlib, data.params, kv_len - 1)
        fn = compiled_flex(self.autotune)
        bm = None
        if case.variant.mask.kind not in ("causal", "none"):
            bm = cached_block_mask(case.variant.mask, 1, kv_len)
        q = data.q.unsqueeze(2)
        k, v = data.dense_k, data.dense_v
        gqa = case.num_qo_heads != case.num_kv_heads

        def run():
            return fn(q, k, v, score_mod=smod, block_mask=bm, enable_gqa=gqa)

        return Prepared(run, canon=lambda o: o.squeeze(2))
