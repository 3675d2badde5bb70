"""Keyword arguments of an attention call that the transformers backend cannot apply, and
masks a model indexes or computes with.

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
    [("indices", "top-k selection of keys"), ("block_indices", "selection of key blocks")],
)
def test_a_key_selection_is_refused_even_after_a_remembered_choice(key, words):
    layer = torch.nn.Module()
    assert _choose(layer).spec == "stdlib:causal"  # remembered for these settings
    with pytest.raises(UnsupportedMaskError, match=f"`{key}` .*{words}"):
        _choose(layer, **{key: torch.zeros(1, 4, 2, dtype=torch.int32)})


def test_tensors_eager_attention_ignores_are_ignored():
    """eager and sdpa ignore ``token_type_ids`` (a tokenizer's batch reaches every layer
    through ``**kwargs``): refusing every unknown tensor broke ``model(**batch)``."""
    layer = torch.nn.Module()
    ignored = {
        "position_ids": torch.arange(4)[None],
        "cache_position": torch.arange(4),
        "cu_seq_lens_q": torch.tensor([0, 4]),
        "token_type_ids": torch.zeros(1, 4, dtype=torch.long),
    }
    assert _choose(layer, use_cache=True, indices=None, **ignored).spec == "stdlib:causal"


def test_indexing_the_backends_mask_names_what_the_model_did():
    mask = BatchSegments(1, 4, 4, (RowSegment(0, 0, 4, 0, 4),), frozenset({None}))
    for index in ((slice(None), slice(None), [0, 1]), 0):
        with pytest.raises(MaskReadAsTensorError, match="indexes the mask"):
            mask[index]
    with pytest.raises(UnsupportedMaskError):  # what the docs promise for such models
        mask[0]


def test_computing_with_the_backends_mask_names_what_the_model_did():
    """Bloom adds its ALiBi bias to the mask: a bare TypeError before."""
    mask = BatchSegments(1, 4, 4, (RowSegment(0, 0, 4, 0, 4),), frozenset({None}))
    for combine in (
        lambda: torch.zeros(1) + mask,
        lambda: mask + 1.0,
        lambda: mask * torch.ones(1),
        lambda: ~mask,
        lambda: torch.ones(1, dtype=torch.bool) & mask,
    ):
        with pytest.raises(MaskReadAsTensorError, match="computes with the mask"):
            combine()
