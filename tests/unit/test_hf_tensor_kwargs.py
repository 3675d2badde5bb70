"""Tensor keyword arguments of an attention call that the transformers backend does not
apply, and masks a model indexes.

DeepSeek-V3.2-style layers hand the interface ``indices`` (a top-k selection of keys per
query) and MiniMax-M3's sparse layers ``block_indices``, expecting any implementation other
than eager/sdpa to apply them: the backend dropped both in ``**kwargs`` and ran dense causal
attention (logits 0.42 off eager's on a tiny MiniMax-M3). Gemma-4's KV-sharing layers slice the
mask (``mask[:, :, idx, :]``), which raised a bare ``TypeError``."""

from __future__ import annotations

import pytest
import torch

from attnc.integrations.hf_masks import BatchSegments, MaskReadAsTensorError, RowSegment
from attnc.integrations.hf_variants import variant_for_layer
from attnc.integrations.transformers import UnsupportedMaskError


def _choose(layer: torch.nn.Module, **kwargs: object):
    return variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs=kwargs)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("indices", "top-k selection of keys"),
        ("block_indices", "selection of key blocks"),
        ("token_bias", "does not apply"),
    ],
)
def test_an_unapplied_tensor_is_refused_even_after_a_remembered_choice(key, words):
    layer = torch.nn.Module()
    assert _choose(layer).spec == "stdlib:causal"  # remembered for these settings
    with pytest.raises(UnsupportedMaskError, match=f"`{key}` .*{words}"):
        _choose(layer, **{key: torch.zeros(1, 4, 2, dtype=torch.int32)})


def test_tensors_the_backend_reads_or_that_leave_the_result_alone_pass():
    layer = torch.nn.Module()
    known = {
        "position_ids": torch.arange(4)[None],
        "cache_position": torch.arange(4),
        "cu_seq_lens_q": torch.tensor([0, 4]),
        "cu_seq_lens_k": torch.tensor([0, 4]),
    }
    assert _choose(layer, use_cache=True, indices=None, **known).spec == "stdlib:causal"


def test_a_tensor_name_with_control_characters_is_shown_escaped():
    with pytest.raises(UnsupportedMaskError) as raised:
        _choose(torch.nn.Module(), **{"bias\x1b[2J": torch.zeros(1)})
    assert "\x1b" not in str(raised.value) and "bias" in str(raised.value)


def test_indexing_the_backends_mask_names_what_the_model_did():
    mask = BatchSegments(1, 4, 4, (RowSegment(0, 0, 4, 0, 4),), frozenset({None}))
    for index in ((slice(None), slice(None), [0, 1]), 0):
        with pytest.raises(MaskReadAsTensorError, match="indexes the mask"):
            mask[index]
    with pytest.raises(UnsupportedMaskError):  # what the docs promise for such models
        mask[0]
