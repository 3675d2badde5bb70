"""Owns: turning the attention masks transformers builds into one request per batch row.

transformers describes what each query of a batch row may see with a 4D mask ``[B, 1, Q, KV]``.
An attnc variant runs over one request whose queries are aligned to the end of its KV
(``q_pos = q_idx + kv_len - q_len``). A row maps onto one such request when its mask is the
layer's causal (optionally sliding-window) pattern over a contiguous run ``[first, last)`` of
valid keys: what left padding (batched ``generate()``), right padding and a KV cache give.
Each row then becomes a :class:`RowSegment`: the queries whose key position lies in the run,
over the keys ``[first, position of its last query]``. Queries outside the run are padding;
their output is 0, except the query of a one-token step that sees its whole run from past it
(a static cache's unused tail): it runs as the query at the run's end. Any other mask (packed
sequences, chunked attention, image-token overlays, additive biases) raises
:class:`UnsupportedMaskError`, which names what it found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


class UnsupportedMaskError(ValueError):
    """An attention mask (or a layer setting) that no attnc variant can express."""


class MaskReadAsTensorError(UnsupportedMaskError, AttributeError):
    """A model read a tensor attribute (``dtype``, ``device``, ...) of the mask attnc built;
    an AttributeError too, so ``hasattr`` and ``getattr(..., default)`` still answer."""


@dataclass(frozen=True)
class RowSegment:
    """The request of one batch row: queries ``[q_begin, q_end)`` over keys ``[kv_begin, kv_end)``
    of that row; the last query sits at key position ``kv_end - 1``."""

    row: int
    q_begin: int
    q_end: int
    kv_begin: int
    kv_end: int


@dataclass(eq=False)
class BatchSegments:
    """The requests of one attention call (or of one step, shared by the layers of a kind).

    ``windows`` holds the sliding windows (``None``: plain causal) whose pattern equals the
    mask; ``None`` instead of a set means no mask was given, so the layer's own settings
    decide. ``plans`` is where executors keep what they prepared for this batch, so the layers
    that share this object plan once.
    """

    batch_size: int
    q_len: int
    kv_len: int
    segments: tuple[RowSegment, ...]
    windows: frozenset[int | None] | None
    plans: dict[Any, Any] = field(default_factory=dict)

    # transformers looks at ``ndim`` / ``shape`` of a mask handed back to the model (as
    # ``generate()`` does with a static cache): this reads as an already built 4D mask.
    ndim = 4

    def __getattr__(self, name: str) -> Any:
        # Only attributes the object lacks: a model that treats the mask as a tensor.
        if name.startswith("__"):
            raise AttributeError(name)
        raise MaskReadAsTensorError(
            f"attention_mask: the model reads `.{name}` of the mask the attnc backend built "
            "(its requests, not a tensor): a model that edits its attention mask after "
            "transformers builds it is not supported"
        )

    def __getitem__(self, index: object) -> Any:
        """Refused: a model that slices or indexes the mask treats it as a tensor."""
        raise MaskReadAsTensorError(
            "attention_mask: the model indexes the mask the attnc backend built (its "
            "requests, not a tensor): a model that slices or edits its attention mask after "
            "transformers builds it is not supported"
        )

    def _as_operand(self, *_: object) -> Any:
        """Refused: a model that adds, multiplies or combines the mask treats it as a
        tensor (Bloom adds its ALiBi bias to it)."""
        raise MaskReadAsTensorError(
            "attention_mask: the model computes with the mask the attnc backend built (its "
            "requests, not a tensor), as a model that adds a bias to its attention mask does: "
            "not supported"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _as_operand
    __and__ = __rand__ = __or__ = __ror__ = __invert__ = __neg__ = _as_operand

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(batch, 1, q_len, kv_len)``, the shape of the mask this stands for."""
        return (self.batch_size, 1, self.q_len, self.kv_len)

    def require_window(self, window: int | None, layer: str) -> None:
        """UnsupportedMaskError unless the mask is the pattern of ``window`` (None: causal)."""
        if self.windows is None or window in self.windows:
            return
        found = ", ".join(_pattern_name(w) for w in sorted(self.windows, key=_window_key))
        raise UnsupportedMaskError(
            f"{layer}: the attention mask is {found or 'no causal pattern'} over padded rows, "
            f"but the layer's settings ask for {_pattern_name(window)}"
        )

    @property
    def is_uniform(self) -> bool:
        """Every row is one full-width request of the same shape (no padding)."""
        if len(self.segments) != self.batch_size:
            return False
        first = self.segments[0]
        return all(
            (s.q_begin, s.q_end, s.kv_begin, s.kv_end)
            == (first.q_begin, first.q_end, first.kv_begin, first.kv_end)
            for s in self.segments
        )


def _window_key(w: int | None) -> int:
    return -1 if w is None else w


def _pattern_name(window: int | None) -> str:
    return "the causal mask" if window is None else f"a causal sliding window of {window} keys"


def segments_without_mask(batch_size: int, q_len: int, kv_len: int) -> BatchSegments:
    """Every row one request over all its keys, queries aligned to the end (no padding)."""
    rows = tuple(RowSegment(b, 0, q_len, 0, kv_len) for b in range(batch_size) if q_len > 0)
    return BatchSegments(batch_size, q_len, kv_len, rows, None)


def visible_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """The boolean ``[B, Q, KV]`` visibility of a 4D transformers mask (bool, or float with 0
    for visible and a large negative value for masked positions)."""
    if mask.dim() != 4 or mask.shape[1] == 0:
        raise UnsupportedMaskError(
            f"attention_mask: expected a 4D mask [batch, heads, q_len, kv_len] with at least "
            f"one head, got shape {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        visible = mask
    elif mask.is_floating_point():
        visible = mask == 0
        masked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((visible | masked).all()):
            raise UnsupportedMaskError(
                "attention_mask: holds additive bias values (neither 0 nor a masking "
                "value); attnc variants express biases in the score, not in the mask"
            )
    else:
        raise UnsupportedMaskError(f"attention_mask: unsupported dtype {mask.dtype}")
    if visible.shape[1] != 1:
        if not bool((visible == visible[:, :1]).all()):
            raise UnsupportedMaskError("attention_mask: differs between heads")
    return visible[:, 0]


def segments_from_visibility(
    visible: torch.Tensor, query_start: int, windows: Iterable[int | None]
) -> BatchSegments:
    """Segments of a ``[B, Q, KV]`` visibility whose query ``i`` sits at key position
    ``query_start + i``; ``windows`` are the patterns to compare with (``None``: causal)."""
    batch, q_len, kv_len = visible.shape
    seen = visible.any(dim=1)  # [B, KV]: keys some query of the row sees
    has_key = seen.any(dim=1)
    first = torch.where(has_key, seen.int().argmax(dim=1), 0)
    last = torch.where(has_key, kv_len - seen.flip(1).int().argmax(dim=1), 0)
    key = torch.arange(kv_len, device=visible.device).view(1, 1, kv_len)
    pos = (torch.arange(q_len, device=visible.device) + query_start).view(1, q_len, 1)
    in_run = (key >= first.view(-1, 1, 1)) & (key < last.view(-1, 1, 1)) & (key <= pos)
    candidates = list(dict.fromkeys(windows))
    equal = [(_windowed(in_run, pos, key, w) == visible).all().view(1) for w in candidates]
    # One read-back for the runs and the pattern checks (each is a device synchronisation).
    host = torch.cat([first, last, *equal]).tolist()
    firsts, lasts, flags = host[:batch], host[batch : 2 * batch], host[2 * batch :]
    matched = frozenset(w for w, ok in zip(candidates, flags, strict=True) if ok)
    if not matched:
        names = ", ".join(_pattern_name(w) for w in dict.fromkeys(windows))
        raise UnsupportedMaskError(
            "attention_mask: not a padded form of "
            f"{names}: attnc maps a row onto one request whose valid keys are contiguous "
            "(packed sequences, chunked attention and custom mask overlays are not supported)"
        )
    rows = []
    for b, (lo, hi) in enumerate(zip(firsts, lasts, strict=True)):
        q_begin = min(max(lo - query_start, 0), q_len)
        q_end = min(max(hi - query_start, 0), q_len)
        if q_end > q_begin:
            rows.append(RowSegment(b, q_begin, q_end, lo, q_end + query_start))
        elif q_len == 1 and hi > lo:
            # One query that sees its whole run but sits past it (a static cache's unused
            # tail after the run): it is no padding, and seeing [lo, hi) it is the query at
            # key position hi - 1 (every pattern that matched keeps those keys there).
            rows.append(RowSegment(b, 0, 1, lo, hi))
    return BatchSegments(batch, q_len, kv_len, tuple(rows), matched)


def _windowed(
    in_run: torch.Tensor, pos: torch.Tensor, key: torch.Tensor, window: int | None
) -> torch.Tensor:
    # key > pos - window: the same as pos - key < window, without an int64 [Q, KV] temporary
    return in_run if window is None else in_run & (key > pos - window)


def segments_for_call(
    mask: object, q_len: int, kv_len: int, batch_size: int, window: int | None
) -> BatchSegments:
    """The segments of one attention call: from the step's :class:`BatchSegments`, from a 4D
    mask tensor (queries aligned to the end of the KV; compared with the causal pattern and
    the layer's ``window``), or without a mask."""
    if isinstance(mask, BatchSegments):
        if (mask.batch_size, mask.q_len, mask.kv_len) != (batch_size, q_len, kv_len):
            raise UnsupportedMaskError(
                f"attention_mask: built for batch {mask.batch_size}, q_len {mask.q_len}, "
                f"kv_len {mask.kv_len}, but the layer has {batch_size}, {q_len}, {kv_len}"
            )
        return mask
    if mask is None:
        return segments_without_mask(batch_size, q_len, kv_len)
    if isinstance(mask, torch.Tensor):
        visible = visible_from_mask(mask)
        if tuple(visible.shape) != (batch_size, q_len, kv_len):
            raise UnsupportedMaskError(
                f"attention_mask: shape {tuple(mask.shape)} does not match batch {batch_size}, "
                f"q_len {q_len}, kv_len {kv_len}"
            )
        return segments_from_visibility(visible, kv_len - q_len, (None, window))
    raise UnsupportedMaskError(f"attention_mask: unsupported type {type(mask).__name__}")
