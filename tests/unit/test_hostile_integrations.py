"""Hostile calls to the transformers backend's attention function (CPU, reference path): each
is refused with a ValueError that names the argument and the problem, never a raw IndexError
or a silently wrong result."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from attnc.integrations.transformers import attnc_attention_forward


@pytest.fixture(autouse=True)
def _quiet():
    """The reference path warns once that it is slow; not what these tests look at."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _qkv(batch=2, hq=4, hkv=2, q_len=5, kv_len=5, head_dim=16):
    torch.manual_seed(0)
    q = torch.randn(batch, hq, q_len, head_dim)
    k = torch.randn(batch, hkv, kv_len, head_dim)
    return q, k, torch.randn(batch, hkv, kv_len, head_dim)


@pytest.mark.parametrize(
    ("which", "bad", "message"),
    [
        ("key", lambda k: k[:1], "key: batch 1"),
        ("value", lambda v: v[:, :, :4], "value: shape"),
        ("value", lambda v: v[:, :1], "value: shape"),
        ("key", lambda k: k[..., :8], "key: head_dim 8"),
        ("query", lambda q: q[0], "query: expected a 4D tensor"),
    ],
)
def test_query_key_value_shapes_that_disagree_are_named(which, bad, message):
    """A value with fewer keys or heads than the key (same strides) was read past its end by
    the in-place decode view; a key of another batch size ended in a raw IndexError."""
    q, k, v = _qkv()
    args = {"query": q, "key": k, "value": v}
    args[which] = bad(args[which])
    with pytest.raises(ValueError, match=message):
        attnc_attention_forward(torch.nn.Module(), attention_mask=None, **args)


def test_a_value_head_dim_other_than_the_keys_is_unsupported():
    """Models whose value heads differ in size from the query/key heads (e.g. MLA) have no
    attnc variant: an UnsupportedMaskError names both sizes."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv()
    with pytest.raises(UnsupportedMaskError, match="value head_dim 8 .* key head_dim 16"):
        attnc_attention_forward(torch.nn.Module(), q, k, v[..., :8], None)


@pytest.mark.parametrize(
    "window", [2.5, float("nan"), float("inf"), "4", True, np.True_, torch.tensor(True)]
)
def test_a_sliding_window_that_is_not_a_whole_number_of_keys_is_named(window):
    """2.5 was truncated to a window of 2 keys (transformers' mask keeps 3), "4" and True were
    read as 4 and 1, NaN and inf ended in int()'s bare ValueError / OverflowError."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv()
    with pytest.raises(UnsupportedMaskError, match="sliding_window must be a whole number"):
        attnc_attention_forward(torch.nn.Module(), q, k, v, None, sliding_window=window)


@pytest.mark.parametrize("window", [4.0, torch.tensor(4), np.int64(4)])
def test_a_sliding_window_given_as_another_integral_type_is_read_exactly(window):
    q, k, v = _qkv(q_len=9, kv_len=9)
    layer = torch.nn.Module()
    expected, _ = attnc_attention_forward(layer, q, k, v, None, sliding_window=4)
    got, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, None, sliding_window=window)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class TextCrossAttention(torch.nn.Module):
    """Named like Mllama's cross-attention layers, which set no ``is_causal``."""


def _flagged_cross_attention() -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.is_cross_attention = True
    return layer


@pytest.mark.parametrize("make", [TextCrossAttention, _flagged_cross_attention])
def test_a_cross_attention_layer_is_refused(make):
    """Keys from another sequence (image tokens) were attended as a causal window aligned to
    their end: without a mask, 3 text queries over 5 image keys saw 3, 4 and 5 of them."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv(q_len=3, kv_len=5)
    with pytest.raises(UnsupportedMaskError, match="cross-attention"):
        attnc_attention_forward(make(), q, k, v, None)


def test_sinks_that_are_not_a_tensor_are_named():
    """A list of sink logits ended in a raw AttributeError ('list' has no 'detach')."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"sinks.*expected a tensor \[num_heads\], got list"):
        attnc_attention_forward(torch.nn.Module(), q, k, v, None, s_aux=[0.0] * 4)


@pytest.mark.parametrize(
    "cap", ["3", True, np.True_, torch.tensor(True), 0.0, float("nan"), float("inf"), [30.0]]
)
def test_a_softcap_that_is_not_a_finite_nonzero_number_is_named(cap):
    """A cap "3" was read as a cap of 3.0 and True as 1.0; a cap of 0 made every logit 0 (uniform
    weights over the visible keys), NaN every output NaN; a list ended in a raw TypeError."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv()
    with pytest.raises(UnsupportedMaskError, match="softcap must be a finite nonzero number"):
        attnc_attention_forward(torch.nn.Module(), q, k, v, None, softcap=cap)


@pytest.mark.parametrize("cap", [30, np.float32(30.0), torch.tensor(30.0), -30.0])
def test_a_softcap_given_as_another_real_type_is_read_exactly(cap):
    """Integers, NumPy and tensor scalars give the same logits as the float; so does a
    negative cap (cap * tanh(score / cap) is even in cap)."""
    q, k, v = _qkv()
    expected, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, None, softcap=30.0)
    got, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, None, softcap=cap)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ((-256.0) ** -0.5, "scaling: expected a float, got complex"),
        (-0.0625, "scaling: must be a finite number > 0"),
        (float("nan"), "scaling: must be a finite number > 0"),
        ("0.1", "scaling: expected a float, got str"),
    ],
)
def test_a_scaling_the_kernels_cannot_take_is_named_as_scaling(scaling, message):
    """Gemma-2 with a negative query_pre_attn_scalar passes a complex scale; the error named
    `sm_scale`, an argument the model's user never wrote."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=message):
        attnc_attention_forward(torch.nn.Module(), q, k, v, None, scaling=scaling)


def test_sinks_by_their_other_name_are_applied():
    """``sinks=`` (the name some models pass) was dropped silently: the output was the plain
    causal one. It is ``s_aux`` by another name; both at once must be one tensor."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    layer = torch.nn.Module()  # one layer: its plain call's choice must not be reused
    want, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, None, s_aux=sinks)
    plain, _ = attnc_attention_forward(layer, q, k, v, None)
    got, _ = attnc_attention_forward(layer, q, k, v, None, sinks=sinks)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(got, plain)
    with pytest.raises(UnsupportedMaskError, match="both `s_aux` and `sinks`"):
        attnc_attention_forward(torch.nn.Module(), q, k, v, None, s_aux=sinks, sinks=-sinks)


def test_packed_sequences_described_by_cu_seq_lens_are_refused():
    """Two documents packed in one row and described only by cu_seq_lens_q/_k attended across
    their boundary without an error; one sequence is what attnc runs anyway."""
    from attnc.integrations.transformers import UnsupportedMaskError

    q, k, v = _qkv(batch=1, q_len=6, kv_len=6)
    bounds = torch.tensor([0, 3, 6], dtype=torch.int32)
    layer = torch.nn.Module()
    attnc_attention_forward(layer, q, k, v, None)  # a plain call first: nothing reused
    with pytest.raises(UnsupportedMaskError, match="`cu_seq_lens_q` describes 2 packed"):
        attnc_attention_forward(layer, q, k, v, None, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds)
    one = torch.tensor([0, 6], dtype=torch.int32)
    got, _ = attnc_attention_forward(
        torch.nn.Module(), q, k, v, None, cu_seq_lens_q=one, cu_seq_lens_k=one
    )
    want, _ = attnc_attention_forward(torch.nn.Module(), q, k, v, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_alibi_slopes_cast_with_the_model_run_as_f32():
    """model.to(torch.bfloat16) casts the layer's float buffers: bf16 slopes were refused by
    the variant's param check (the sinks were converted)."""
    q, k, v = _qkv()
    layer, cast = torch.nn.Module(), torch.nn.Module()
    layer.alibi_slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    cast.alibi_slopes = layer.alibi_slopes.bfloat16()  # these four are exact in bf16
    want, _ = attnc_attention_forward(layer, q, k, v, None)
    got, _ = attnc_attention_forward(cast, q, k, v, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_causal": torch.tensor([1, 1])}, r"is_causal: expected one value"),
        ({"dropout": 0.5}, r"attention dropout 0\.5"),
    ],
)
def test_layer_settings_are_named_with_control_characters_escaped(kwargs, message):
    """A layer class name or layer_idx with terminal escapes reached the message raw; a
    tensor is_causal of two values ended in torch's 'Boolean value of Tensor' error."""
    from attnc.integrations.transformers import UnsupportedMaskError

    hostile = type("Attn\x1b[2K\r", (torch.nn.Module,), {})()
    hostile.layer_idx = "3\nok"
    q, k, v = _qkv()
    with pytest.raises(UnsupportedMaskError, match=message) as info:
        attnc_attention_forward(hostile, q, k, v, None, **kwargs)
    text = str(info.value)
    assert "\x1b" not in text and "\r" not in text and "\n" not in text
    assert "Attn\\x1b[2K\\r (layer 3\\nok)" in text


def test_head_dim_0_and_bad_mask_offsets_are_named():
    """head_dim 0 ended in a ZeroDivisionError from the default scale; attnc_mask with a
    two-element q_offset in int()'s bare ValueError, and with a float 2D padding mask in
    NotImplementedError from inside transformers."""
    from attnc.integrations.transformers import attnc_mask

    q, k, v = _qkv(head_dim=16)
    with pytest.raises(ValueError, match="query: head_dim is 0"):
        attnc_attention_forward(torch.nn.Module(), q[..., :0], k[..., :0], v[..., :0], None)
    with pytest.raises(ValueError, match=r"q_offset: expected one whole number"):
        attnc_mask(2, 3, 3, q_offset=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"kv_offset: expected one whole number, got float"):
        attnc_mask(2, 3, 3, kv_offset=1.5)
    with pytest.raises(ValueError, match=r"2D padding mask must be bool or integer"):
        attnc_mask(2, 3, 3, attention_mask=torch.ones(2, 3))


def test_numpy_integer_offsets_are_taken_like_ints():
    """attnc_mask refused a numpy integer cache offset ('expected one whole number, got
    int64'), the type a position read from an array has; a numpy bool stays refused."""
    from attnc.integrations.transformers import attnc_mask

    want = attnc_mask(2, 3, 5, q_offset=2, kv_offset=0)
    got = attnc_mask(2, 3, 5, q_offset=np.int64(2), kv_offset=np.int32(0))
    assert (got.segments, got.windows) == (want.segments, want.windows)
    assert want.segments != attnc_mask(2, 3, 5, q_offset=0).segments  # the offset counts
    with pytest.raises(ValueError, match=r"q_offset: expected one whole number, got bool"):
        attnc_mask(2, 3, 5, q_offset=np.bool_(True))
