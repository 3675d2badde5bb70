"""Masks in the shape transformers builds -> one request per batch row
(attnc.integrations.hf_masks)."""

import pytest
import torch

from attnc.integrations.hf_masks import (
    RowSegment,
    UnsupportedMaskError,
    segments_for_call,
    segments_from_visibility,
    visible_from_mask,
)


def _mask(valid: torch.Tensor, q_len: int, query_start: int, window: int | None = None):
    """The [B, Q, KV] visibility transformers gives: padding & causal (& window)."""
    kv_len = valid.shape[1]
    key = torch.arange(kv_len).view(1, 1, -1)
    pos = (torch.arange(q_len) + query_start).view(1, -1, 1)
    out = valid.view(valid.shape[0], 1, kv_len) & (key <= pos)
    if window is not None:
        out = out & (pos - key < window)
    return out


def test_left_padding_prefill_gives_one_request_per_row():
    valid = torch.ones(3, 6, dtype=torch.bool)
    valid[0, :2] = False
    valid[2, :6] = False  # an all-padding row has no request
    batch = segments_from_visibility(_mask(valid, 6, 0), 0, (None,))
    assert batch.segments == (RowSegment(0, 2, 6, 2, 6), RowSegment(1, 0, 6, 0, 6))
    assert batch.windows == frozenset({None})
    assert not batch.is_uniform


def test_decode_step_over_a_cache_with_right_and_left_padding():
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, :3] = False  # left padding: keys 3..8
    batch = segments_from_visibility(_mask(valid, 1, 8), 8, (None, 4))
    assert batch.segments == (RowSegment(0, 0, 1, 3, 9), RowSegment(1, 0, 1, 0, 9))
    assert batch.windows == frozenset({None})  # every key is seen: no window of 4


def test_sliding_window_is_told_apart_from_causal():
    valid = torch.ones(1, 10, dtype=torch.bool)
    visible = _mask(valid, 10, 0, window=3)
    batch = segments_from_visibility(visible, 0, (None, 3, 5))
    assert batch.windows == frozenset({3})
    batch.require_window(3, "layer")
    with pytest.raises(UnsupportedMaskError, match="causal sliding window of 3 keys"):
        batch.require_window(None, "layer")


def test_right_padding_rows_keep_only_valid_queries():
    valid = torch.ones(1, 5, dtype=torch.bool)
    valid[0, 3:] = False
    batch = segments_from_visibility(_mask(valid, 5, 0), 0, (None,))
    assert batch.segments == (RowSegment(0, 0, 3, 0, 3),)


def test_a_hole_in_the_keys_is_refused():
    valid = torch.ones(1, 6, dtype=torch.bool)
    valid[0, 2] = False
    with pytest.raises(UnsupportedMaskError, match="valid keys are contiguous"):
        segments_from_visibility(_mask(valid, 6, 0), 0, (None,))


def test_float_masks_and_additive_biases():
    valid = torch.ones(1, 4, dtype=torch.bool)
    visible = _mask(valid, 4, 0)
    as_float = torch.zeros(1, 1, 4, 4).masked_fill(
        ~visible[:, None], torch.finfo(torch.float32).min
    )
    assert torch.equal(visible_from_mask(as_float), visible)
    batch = segments_for_call(as_float, 4, 4, 1, None)
    assert batch.segments == (RowSegment(0, 0, 4, 0, 4),)
    with pytest.raises(UnsupportedMaskError, match="additive bias"):
        visible_from_mask(as_float + 0.5)


def test_shape_checks_and_no_mask():
    with pytest.raises(UnsupportedMaskError, match="does not match"):
        segments_for_call(torch.ones(2, 1, 3, 3, dtype=torch.bool), 3, 4, 2, None)
    batch = segments_for_call(None, 2, 7, 3, 4)
    assert batch.is_uniform and batch.windows is None
    assert batch.segments[0] == RowSegment(0, 0, 2, 0, 7)


def test_a_mask_with_no_heads_is_refused_by_name():
    """Zero heads: the heads compared equal vacuously and ``visible[:, 0]`` raised a bare
    IndexError."""
    with pytest.raises(
        UnsupportedMaskError, match="attention_mask: expected a 4D mask .* at least one head"
    ):
        visible_from_mask(torch.zeros(2, 0, 5, 5))


def test_a_one_token_step_past_its_run_runs_at_the_run_end():
    """A decode step whose 4D mask shows keys [0, 5) of 8 slots (a static cache's unused
    tail): the query was dropped as padding and its output was 0; it is the query at key 4."""
    visible = torch.zeros(2, 1, 8, dtype=torch.bool)
    visible[0, :, :5] = True
    visible[1, :, 2:6] = True  # left padding too
    batch = segments_from_visibility(visible, 7, (None,))
    assert batch.segments == (RowSegment(0, 0, 1, 0, 5), RowSegment(1, 0, 1, 2, 6))

    from attnc.integrations.transformers import attnc_attention_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    out, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, visible[:, None])
    kx, vx = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    s = (q.double() @ kx.transpose(-1, -2) / 4).masked_fill(~visible[:, None], float("-inf"))
    want = (s.softmax(-1) @ vx).transpose(1, 2)
    assert torch.allclose(out.double(), want, atol=1e-5)


_WINDOW_CHECK_PROBE = """
import resource, torch
from attnc.integrations.hf_masks import segments_from_visibility
n = 4096
key = torch.arange(n).view(1, 1, n); pos = torch.arange(n).view(1, n, 1)
visible = (key <= pos) & (key > pos - 1024)
del key, pos
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
batch = segments_from_visibility(visible, 0, (None, 1024))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024, sorted(map(str, batch.windows)))
"""


def test_the_window_check_needs_no_int64_copy_of_the_mask() -> None:
    """The window pattern was checked through pos - key, an int64 [Q, KV] tensor (8x the
    16 MiB mask at 4K, ~8 GiB at 32K): the check grew the process by ~147 MiB; now ~51."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WINDOW_CHECK_PROBE], capture_output=True, text=True, check=True
    )
    grown, windows = done.stdout.split(maxsplit=1)
    assert windows.strip() == "['1024']"
    assert int(grown) < 100, f"the window check grew the process by {grown} MiB"


def test_a_model_that_reads_the_mask_as_a_tensor_is_told_why():
    """Doge post-processes its mask: `.dtype` of the backend's mask ended in a bare
    AttributeError from inside transformers that never named attnc."""
    batch = segments_from_visibility(torch.ones(1, 2, 2, dtype=torch.bool).tril(), 0, (None,))
    with pytest.raises(UnsupportedMaskError, match=r"reads `\.dtype` of the mask the attnc"):
        _ = batch.dtype
    assert not hasattr(batch, "device")  # hasattr / getattr with a default still answer
    assert getattr(batch, "to", None) is None
    assert batch.ndim == 4 and batch.shape == (1, 1, 2, 2)
