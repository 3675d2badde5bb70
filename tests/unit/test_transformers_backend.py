"""transformers models with ``attn_implementation="attnc"`` on the CPU (generated reference path).

Tiny random-weight models built from their configs (no downloads) are compared with
transformers' own ``eager`` / ``sdpa`` attention in float32: logits at every non-padding
position, and greedy ``generate()`` over a left-padded batch (KV cache, decode steps, the
sliding-window cache of Gemma-2 and Mistral).
"""

from __future__ import annotations

import warnings

import pytest
import torch

VOCAB = 128


@pytest.fixture(scope="module")
def hf():
    """transformers with the attnc backend registered (imported here: it takes seconds).

    One intra-op thread: these matrices are tiny, and a busy 2-core runner spends seconds per
    matmul waking threads otherwise."""
    transformers = pytest.importorskip("transformers")
    import attnc.integrations.transformers  # noqa: F401  (registers "attnc")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield transformers
    torch.set_num_threads(threads)


def tiny_config(hf, family: str):
    """A 2-layer, hidden-64 config of ``family`` with GQA (4 query / 2 KV heads)."""
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
    )
    if family == "llama":
        return hf.LlamaConfig(**common)
    if family == "qwen2":
        return hf.Qwen2Config(**common)
    if family == "mistral":
        return hf.MistralConfig(sliding_window=6, **common)
    if family == "gemma2":  # layer 0 sliding (soft-cap + window), layer 1 full (soft-cap)
        return hf.Gemma2Config(head_dim=16, sliding_window=6, attn_logit_softcapping=3.0, **common)
    raise ValueError(family)


def tiny_model(hf, family: str, impl: str):
    torch.manual_seed(0)
    cfg = tiny_config(hf, family)
    return hf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def padded_batch(lengths: list[int], seq: int):
    """Left-padded random prompts of the given lengths."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (len(lengths), seq), generator=g)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, seq - n :] = 1
    return ids, mask


@pytest.mark.parametrize(
    ("family", "baseline"),
    [("llama", "sdpa"), ("qwen2", "sdpa"), ("mistral", "eager"), ("gemma2", "eager")],
)
def test_logits_match_transformers_attention(hf, family, baseline):
    model = tiny_model(hf, family, baseline)
    ids, mask = padded_batch([24, 17, 9], 24)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("attnc")
        got = model(ids, attention_mask=mask).logits
    valid = mask.bool()
    err = (got[valid] - expected[valid]).abs().max().item()
    assert err < 2e-5 * expected[valid].abs().max().item() + 1e-6, err


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_greedy_generate_gives_the_same_tokens(hf, family):
    model = tiny_model(hf, family, "eager")
    ids, mask = padded_batch([12, 5], 12)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = model.generate(ids, **kwargs)
        model.set_attn_implementation("attnc")
        got = model.generate(ids, **kwargs)
    assert got.shape == (2, 20)
    assert torch.equal(got, expected)


def test_generate_with_a_static_cache(hf):
    """generate() builds the mask once ahead of the model with a static cache."""
    model = tiny_model(hf, "llama", "eager")
    ids, mask = padded_batch([10, 4], 10)
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, cache_implementation="static", **kwargs)
    model.set_attn_implementation("attnc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = model.generate(ids, cache_implementation="static", **kwargs)
    assert torch.equal(got, expected)


def test_a_cpu_run_warns_once(hf):
    import attnc.integrations.transformers as backend

    backend._warned.clear()
    model = tiny_model(hf, "llama", "attnc")
    ids, mask = padded_batch([6], 6)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(ids, attention_mask=mask)
        model(ids, attention_mask=mask)
    notes = [w for w in caught if "generated PyTorch reference" in str(w.message)]
    assert len(notes) == 1


def tiny_gpt_oss(hf, impl: str):
    """A 2-layer gpt-oss (layer 0 sliding window of 6, layer 1 full; sinks on both)."""
    torch.manual_seed(0)
    cfg = hf.GptOssConfig(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=6,
    )
    model = hf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    with torch.no_grad():  # sinks big enough to matter (they start near 0)
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def test_gpt_oss_sinks_match_eager_or_name_what_is_missing(hf):
    """With the language's sinks: logits and greedy tokens of eager; without: a clear error."""
    from attnc.integrations.hf_sinks import sink_support_gap
    from attnc.integrations.transformers import UnsupportedMaskError

    model = tiny_gpt_oss(hf, "eager")
    ids, mask = padded_batch([14, 9], 14)
    if sink_support_gap() is not None:
        model.set_attn_implementation("attnc")
        with pytest.raises(UnsupportedMaskError, match="sink = ...;"), torch.no_grad():
            model(ids, attention_mask=mask)
        return
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = model(ids, attention_mask=mask).logits
        expected_tokens = model.generate(ids, **kwargs)
        model.set_attn_implementation("attnc")
        got = model(ids, attention_mask=mask).logits
        got_tokens = model.generate(ids, **kwargs)
    valid = mask.bool()
    err = (got[valid] - expected[valid]).abs().max().item()
    assert err < 2e-5 * expected[valid].abs().max().item() + 1e-6, err
    assert torch.equal(got_tokens, expected_tokens)


def test_a_missing_sink_feature_is_named(hf, monkeypatch):
    """An attnc whose language lacks `sink` raises naming the layer and the missing feature."""
    import attnc.integrations.hf_variants as variants
    from attnc.integrations.transformers import UnsupportedMaskError

    monkeypatch.setattr(variants, "sink_support_gap", lambda: "this attnc does not compile it")
    model = tiny_gpt_oss(hf, "attnc")
    with pytest.raises(UnsupportedMaskError) as caught, torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 8)))
    message = str(caught.value)
    assert "GptOssAttention (layer 0)" in message and "sink = ...;" in message
    assert "this attnc does not compile it" in message


def test_packed_sequences_are_refused_clearly(hf):
    from attnc.integrations.transformers import UnsupportedMaskError

    model = tiny_model(hf, "llama", "attnc")
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    with pytest.raises(UnsupportedMaskError, match="packed sequences"), torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 8)), position_ids=positions, use_cache=False)


def test_alibi_slopes_on_a_layer_match_an_explicit_bias(hf):
    from attnc.integrations.transformers import attnc_attention_forward

    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.num_key_value_groups = 2
    layer.alibi_slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    q, k, v = (torch.randn(2, n, 7, 16, dtype=torch.float64) for n in (4, 2, 2))
    out, _ = attnc_attention_forward(layer, q, k, v, None, scaling=0.3)
    kx, vx = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, kx) * 0.3
    dist = torch.arange(7).view(1, -1) - torch.arange(7).view(-1, 1)  # kv - q
    s = s + layer.alibi_slopes.view(1, -1, 1, 1).double() * dist
    s = s.masked_fill(dist > 0, float("-inf"))
    expected = torch.einsum("bhqk,bhkd->bqhd", s.softmax(-1), vx)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


class _RaggedWrapperStandIn:
    """``attnc.BatchPrefillWrapper`` on the CPU: the reference over each planned request."""

    plans: list[dict] = []

    def __init__(self, variant, workspace, kv_layout="NHD"):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.variant = variant

    def plan(self, qo_indptr, kv_indptr, hq, hkv, head_dim, *, sm_scale, dtype, params):
        assert qo_indptr.dtype == kv_indptr.dtype == torch.int32
        self.qo, self.kv, self.sm_scale = qo_indptr.tolist(), kv_indptr.tolist(), sm_scale
        _RaggedWrapperStandIn.plans.append(dict(params))

    def run(self, q, kv, **params):
        k, v = kv
        assert q.is_contiguous() and k.is_contiguous() and q.shape[0] == self.qo[-1]
        outs = []
        for b in range(len(self.qo) - 1):
            qs, ks = slice(self.qo[b], self.qo[b + 1]), slice(self.kv[b], self.kv[b + 1])
            outs.append(
                self.variant.reference(q[qs], k[ks], v[ks], sm_scale=self.sm_scale, **params)
            )
        return torch.cat(outs)


def test_kernel_path_plans_once_per_step_and_mask_kind(hf, monkeypatch):
    """The CUDA path's packing, indptrs and plan reuse, with the wrapper stood in for
    (decode steps packed too, as when the cache's strides rule out reading it in place)."""
    import attnc
    import attnc.integrations.transformers as backend

    monkeypatch.setattr(backend, "_kernel_blocker", lambda query, head_dim: None)
    monkeypatch.setattr(backend, "is_decode_call", lambda segments, q_len: False)
    monkeypatch.setattr(attnc, "BatchPrefillWrapper", _RaggedWrapperStandIn, raising=False)
    _RaggedWrapperStandIn.plans = []
    model = tiny_model(hf, "gemma2", "eager")
    ids, mask = padded_batch([10, 4], 10)
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    model.set_attn_implementation("attnc")
    with torch.no_grad():
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    # 3 forwards (prefill + 2 decode steps) x 2 mask kinds (sliding, full): one plan each.
    assert _RaggedWrapperStandIn.plans == [{"window": 6}, {}] * 3


def test_layer_settings_without_a_variant_are_named(hf):
    from attnc.integrations.transformers import UnsupportedMaskError, attnc_attention_forward

    layer = torch.nn.Module()
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    with pytest.raises(UnsupportedMaskError, match="is_causal=False"):
        attnc_attention_forward(layer, q, k, k, None, is_causal=False)
    with pytest.raises(UnsupportedMaskError, match="dropout 0.1"):
        attnc_attention_forward(layer, q, k, k, None, dropout=0.1)
    layer.config = hf.LlamaConfig(attention_chunk_size=8)
    with pytest.raises(UnsupportedMaskError, match="attention_chunk_size"):
        attnc_attention_forward(layer, q, k, k, None)


@pytest.mark.parametrize(
    ("setting", "message"),
    [("use_bidirectional_attention", "use_bidirectional_attention"),
     ("attention_dropout", "attention dropout 0.1")],
)  # fmt: skip
def test_a_model_whose_settings_have_no_variant_names_them(hf, setting, message):
    """Whole models (not single layers): Gemma-2 with bidirectional attention, and Llama with
    attention dropout in training mode, raise naming the setting."""
    from attnc.integrations.transformers import UnsupportedMaskError

    torch.manual_seed(0)
    if setting == "use_bidirectional_attention":
        cfg = tiny_config(hf, "gemma2")
        cfg.use_bidirectional_attention = True
    else:
        cfg = tiny_config(hf, "llama")
        cfg.attention_dropout = 0.1
    model = hf.AutoModelForCausalLM.from_config(cfg, attn_implementation="attnc")
    model.train(setting == "attention_dropout")
    with pytest.raises(UnsupportedMaskError, match=message):
        model(torch.randint(0, VOCAB, (1, 8)))


def test_a_layers_variant_is_reused_only_for_the_same_settings():
    from attnc.integrations.hf_variants import variant_for_layer

    layer = torch.nn.Module()
    plain = variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs={})
    again = variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs={})
    assert again is plain and plain.spec == "stdlib:causal"
    windowed = variant_for_layer(layer, dropout=0.0, sliding_window=5, softcap=None, kwargs={})
    assert windowed.spec == "stdlib:sliding_window" and windowed.window == 5
    layer.alibi_slopes = torch.ones(2)  # a tensor setting: decided afresh, never cached
    alibi = variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs={})
    assert alibi.spec == "stdlib:alibi" and alibi.run_params()["slopes"] is layer.alibi_slopes


@pytest.mark.parametrize(
    "where, name, value, words",
    [("config", "use_bidirectional_attention", True, "use_bidirectional_attention"),
     ("config", "attention_chunk_size", 8192, "attention_chunk_size"),
     ("module", "is_cross_attention", True, "cross-attention")],
)  # fmt: skip
def test_a_setting_changed_in_place_is_decided_again(where, name, value, words):
    """The remembered choice was keyed by the config's id: a config setting or the module's
    is_cross_attention changed in place kept the causal variant, where a fresh decision
    refuses it."""
    import types

    from attnc.integrations.hf_variants import variant_for_layer
    from attnc.integrations.transformers import UnsupportedMaskError

    layer = torch.nn.Module()
    layer.config = types.SimpleNamespace()

    def choose():
        return variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs={})

    assert choose().spec == "stdlib:causal"
    setattr(layer.config if where == "config" else layer, name, value)
    with pytest.raises(UnsupportedMaskError, match=words):
        choose()


def test_a_tensor_setting_is_decided_afresh():
    """A tensor window read in place after the first call was served by the first choice."""
    from attnc.integrations.hf_variants import LayerCall, _settings_key

    layer = torch.nn.Module()
    call = LayerCall(layer, 0.0, torch.tensor(5), None, {})
    assert _settings_key(call) is None


def test_settings_reached_through_properties_are_keyed_as_the_choice_reads_them():
    """The key read config, sinks and alibi_slopes from the module's __dict__, parameters and
    buffers, the choice through getattr: a config or slopes behind a property were left out,
    and a stale choice was served after they changed."""
    import types

    from attnc.integrations.hf_variants import variant_for_layer
    from attnc.integrations.transformers import UnsupportedMaskError

    shared = types.SimpleNamespace()
    slopes = [None]

    class Attn(torch.nn.Module):
        config = property(lambda self: shared)
        alibi_slopes = property(lambda self: slopes[0])

    layer = Attn()

    def choose():
        return variant_for_layer(layer, dropout=0.0, sliding_window=None, softcap=None, kwargs={})

    assert choose().spec == "stdlib:causal"
    slopes[0] = torch.full((2,), 5.0)
    chosen = choose()
    assert chosen.spec == "stdlib:alibi" and chosen.run_params()["slopes"] is slopes[0]
    slopes[0] = None
    assert choose().spec == "stdlib:causal"
    shared.use_bidirectional_attention = True
    with pytest.raises(UnsupportedMaskError, match="use_bidirectional_attention"):
        choose()
