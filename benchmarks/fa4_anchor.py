"""FlashAttention-4 (flash-attn-4, CuTe DSL) as a prefill anchor.

Owns: the mapping from a benchmark row to FA4's ``flash_attn_func`` keywords, FA4's ALiBi
``score_mod`` and the FA4 system itself. FA4 needs apache-tvm-ffi 0.1.11 while FlashInfer
0.5.3 needs 0.1.6, so this system runs in the anchor child process (``child_server.py``),
never next to FlashInfer; ``fa4_call`` is pure Python so the parent can tell which rows FA4
can express without importing it.

Rows: causal, soft-cap (FA4's ``softcap``), sliding window (``window_size=(w - 1, 0)``,
causal), ALiBi (a ``score_mod`` computing the standard slope 2^(-8 (h + 1) / H) from the head
index; ``pack_gqa=False`` keeps one head per tile, so the slope's exp2 has one input per tile
and need not be evaluated per score; its cost shows in the figure), and the sigmoid row, where FA4 runs full
(unmasked) softmax attention as a stand-in that is timed but not compared. Prefix-LM needs a
``mask_mod`` plus block-sparsity tensors to skip tiles; FlexAttention's FLASH backend
(``flex_flash``) covers that row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.outcome import Missing, Unsupported
from benchmarks.system import Prepared, System

STAND_IN_NOTE = "full softmax stand-in, not compared"


@dataclass(frozen=True)
class Fa4Call:
    """How FA4 runs one row: ``flash_attn_func`` keywords, plus the score_mod to build."""

    kwargs: dict = field(default_factory=dict)
    alibi: bool = False
    stand_in: bool = False
    note: str = ""


def fa4_call(case) -> Fa4Call:
    """FA4's call for a prefill row, or Unsupported (pure Python: no FA4 import)."""
    variant = case.variant
    mask, stdlib = variant.mask, variant.stdlib
    if stdlib == "sigmoid" and mask.kind == "none":
        return Fa4Call({"causal": False}, stand_in=True, note=STAND_IN_NOTE)
    if mask.kind == "none":
        raise Unsupported(f"{stdlib} without a mask")
    if mask.kind == "prefix":
        raise Unsupported("prefix-LM needs a mask_mod plus block sparsity tensors (see flex_flash)")
    kwargs: dict = {"causal": True}
    if mask.kind == "window":
        kwargs["window_size"] = (mask.window - 1, 0)
    if stdlib in ("causal", "sliding_window"):
        return Fa4Call(kwargs)
    if stdlib == "softcap":
        kwargs["softcap"] = float(variant.scalar_params["cap"])
        return Fa4Call(kwargs)
    if stdlib == "alibi":
        kwargs["pack_gqa"] = False
        return Fa4Call(kwargs, alibi=True, note="score_mod, pack_gqa off")
    raise Unsupported(f"{stdlib}: not expressible here")


_ALIBI_MODS: dict[tuple[int, int], object] = {}


def alibi_score_mod(num_heads: int, offset: int):
    """A CuTe DSL score_mod adding slope_h * (kv_idx - q_idx - offset), slope_h the standard
    2^(-8 (h + 1) / H); ``offset`` = kv_len - q_len (bottom-right alignment). One object per
    (H, offset), so FA4's compile cache (keyed by source and captured values) is hit."""
    key = (num_heads, offset)
    if key in _ALIBI_MODS:
        return _ALIBI_MODS[key]
    import cutlass
    import cutlass.cute as cute

    step = -8.0 / num_heads
    shift = float(offset)

    @cute.jit
    def alibi(score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        s = score.to(cutlass.Float32)
        exponent = (head_idx + cute.full_like(head_idx, 1)).to(cutlass.Float32)
        slope = cute.math.exp2(exponent * cute.full_like(s, step), fastmath=True)
        dist = (kv_idx - q_idx).to(cutlass.Float32) - cute.full_like(s, shift)
        return s + slope * dist

    _ALIBI_MODS[key] = alibi
    return alibi


def flash_attn_func():
    """FA4's ``flash_attn_func``, or Missing with the reason."""
    try:
        from flash_attn.cute.interface import flash_attn_func as fn
    except Exception as exc:
        raise Missing(f"flash-attn-4 not importable ({type(exc).__name__})") from exc
    return fn


class Fa4Prefill(System):
    """``flash_attn_func`` on one request, q/k/v as [1, L, H, D] (views of the NHD inputs)."""

    name = "fa4"

    def prepare(self, case, data) -> Prepared:
        """Keywords for the row (score_mod built for ALiBi); the first call compiles."""
        call = fa4_call(case)
        fn = flash_attn_func()
        kwargs = dict(call.kwargs)
        if call.alibi:
            kwargs["score_mod"] = alibi_score_mod(case.num_qo_heads, case.kv_len - case.q_len)
        q, k, v = (t.unsqueeze(0) for t in (data.q, data.k, data.v))

        def run():
            return fn(q, k, v, **kwargs)[0]

        return Prepared(run, canon=lambda o: o[0], note=call.note, compare=not call.stand_in)
