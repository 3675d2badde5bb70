"""Benchmark rows: the shapes of ANCHORS.md plus a few extra head dims and GQA ratios."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mask:
    """Which (q, kv) pairs a variant keeps; positions use bottom-right alignment.

    kind: ``none`` (all pairs), ``causal`` (kv_idx <= q_pos), ``window`` (causal and
    q_pos - kv_idx < window) or ``prefix`` (causal or kv_idx < prefix).
    """

    kind: str = "causal"
    window: int = 0
    prefix: int = 0


@dataclass(frozen=True)
class VariantSpec:
    """A stdlib variant with the parameters a benchmark row passes to it."""

    label: str
    stdlib: str
    mask: Mask
    params: tuple[tuple[str, float | int], ...] = ()

    @property
    def scalar_params(self) -> dict[str, float | int]:
        """Scalar parameters by keyword (tensor parameters are made with the inputs)."""
        return dict(self.params)


VARIANTS: dict[str, VariantSpec] = {
    "causal": VariantSpec("causal", "causal", Mask("causal")),
    "softcap": VariantSpec("soft-cap 30", "softcap", Mask("causal"), (("cap", 30.0),)),
    "alibi": VariantSpec("ALiBi", "alibi", Mask("causal")),
    "sliding_window": VariantSpec(
        "sliding window 1024", "sliding_window", Mask("window", window=1024), (("window", 1024),)
    ),
    "sigmoid": VariantSpec("sigmoid", "sigmoid", Mask("none"), (("bias", 0.0),)),
    "prefix_lm": VariantSpec(
        "prefix-LM 1024", "prefix_lm", Mask("prefix", prefix=1024), (("prefix_len", 1024),)
    ),
}


@dataclass(frozen=True)
class PrefillCase:
    """One request of q_len queries over kv_len keys (bottom-right aligned)."""

    variant: VariantSpec
    q_len: int
    kv_len: int
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128

    @property
    def name(self) -> str:
        """Row label for the report."""
        size = (
            f"L={self.kv_len}" if self.q_len == self.kv_len else f"q={self.q_len} kv={self.kv_len}"
        )
        extra = f" D={self.head_dim}" if self.head_dim != 128 else ""
        if self.num_qo_heads // self.num_kv_heads != 4:
            extra += f" GQA {self.num_qo_heads // self.num_kv_heads}"
        return f"{self.variant.label}, {size}{extra}"


@dataclass(frozen=True)
class DecodeCase:
    """A batch of single-token queries over a paged KV cache (random page order)."""

    variant: VariantSpec
    kv_lens: tuple[int, ...]
    label: str = ""
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16

    @property
    def name(self) -> str:
        """Row label for the report."""
        extra = "" if self.page_size == 16 else f", page {self.page_size}"
        if self.num_qo_heads // self.num_kv_heads != 4:
            extra += f", GQA {self.num_qo_heads // self.num_kv_heads}"
        if self.label:
            return f"{self.label}, {self.variant.label}{extra}"
        return f"{self.variant.label}, batch {len(self.kv_lens)} x {self.kv_lens[0]}{extra}"


@dataclass(frozen=True)
class BatchPrefillCase:
    """Ragged causal prefill over a paged KV cache, q_len == kv_len per request."""

    variant: VariantSpec
    lens: tuple[int, ...]
    label: str = ""
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16

    @property
    def name(self) -> str:
        """Row label for the report."""
        return f"{self.label or 'batch prefill'}, {self.variant.label}"


def decode_zipf() -> list[int]:
    """KV lengths of ``decode_zipf`` (64 requests, 231,550 tokens)."""
    return [min(32768, max(256, int(32768 / (i + 1) ** 0.8))) for i in range(64)]


def decode_uniform() -> list[int]:
    """KV lengths of ``decode_uniform`` (64 requests, 539,950 tokens)."""
    return [512 + int(15872 * ((i * 0.6180339887) % 1.0)) for i in range(64)]


def prefill_zipf() -> list[int]:
    """Request lengths of ``prefill_zipf`` (16 requests, 55,385 tokens)."""
    return [min(16384, max(128, int(16384 / (i + 1)))) for i in range(16)]


def prefill_cases(quick: bool = False, full: bool = True) -> list[PrefillCase]:
    """Single-request prefill rows: quick (2), fast (``full=False``: every variant at
    L = 8192) or full (also L = 2048, q_len < kv_len, head_dim 64/256, GQA 1 and 8)."""
    v = VARIANTS
    if quick:
        return [PrefillCase(v["causal"], 2048, 2048), PrefillCase(v["softcap"], 2048, 2048)]
    keys = ("causal", "softcap", "alibi", "sliding_window", "sigmoid")
    rows = [PrefillCase(v[key], 8192, 8192) for key in keys]
    rows.append(PrefillCase(v["prefix_lm"], 8192, 8192))
    if not full:
        return rows
    rows += [PrefillCase(v[key], 2048, 2048) for key in keys]
    rows.append(PrefillCase(v["causal"], 1024, 8192))
    for dim in (64, 256):
        rows.append(PrefillCase(v["causal"], 8192, 8192, head_dim=dim))
    rows.append(PrefillCase(v["causal"], 8192, 8192, num_kv_heads=32))
    rows.append(PrefillCase(v["causal"], 8192, 8192, num_kv_heads=4))
    return rows


def decode_cases(quick: bool = False, full: bool = True) -> list[DecodeCase]:
    """Batch 64 x KV 4096 decode rows, page size 16 (full: also GQA 1 and 8, and page
    size 1)."""
    lens = (4096,) * 64
    keys = ("causal",) if quick else ("causal", "softcap", "alibi", "sliding_window")
    rows = [DecodeCase(VARIANTS[k], lens) for k in keys]
    if full and not quick:
        rows.append(DecodeCase(VARIANTS["causal"], lens, num_kv_heads=32))
        rows.append(DecodeCase(VARIANTS["causal"], lens, num_kv_heads=4))
        rows.append(DecodeCase(VARIANTS["causal"], lens, page_size=1))
    return rows


def batch_cases(quick: bool = False) -> list[DecodeCase | BatchPrefillCase]:
    """Skewed batches: decode_zipf, decode_uniform (decode) and prefill_zipf (prefill)."""
    causal = VARIANTS["causal"]
    rows: list[DecodeCase | BatchPrefillCase] = [
        DecodeCase(causal, tuple(decode_zipf()), label="decode_zipf")
    ]
    if not quick:
        rows.append(DecodeCase(causal, tuple(decode_uniform()), label="decode_uniform"))
    rows.append(BatchPrefillCase(causal, tuple(prefill_zipf()), label="prefill_zipf"))
    return rows
