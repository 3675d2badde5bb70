"""transformers models with ``attn_implementation="attnc"`` on CUDA (the generated kernels).

Small random-weight models (head_dim 64, so the kernels run rather than the reference) in
bf16 through attnc, against transformers' ``eager`` attention in float32 on the same weights.
The tolerance is a multiple of the error of ``eager`` itself in bf16. Greedy ``generate()``
over a left-padded batch must pick, at every step, a token whose float32 logit is within that
tolerance of the best one (exact equality would be a coin toss on near-ties of random weights).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu

VOCAB = 256
FAMILIES = ["llama", "qwen2", "mistral", "gemma2"]


@pytest.fixture(scope="module")
def hf():
    """transformers with the attnc backend registered."""
    transformers = pytest.importorskip("transformers")
    import attnc.integrations.transformers  # noqa: F401  (registers "attnc")

    return transformers


def gpu_config(hf, family: str):
    """2 layers, 4 query / 2 KV heads of 64 (a kernel head_dim), windows shorter than the
    prompts."""
    common = dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    if family == "llama":
        return hf.LlamaConfig(**common)
    if family == "qwen2":
        return hf.Qwen2Config(**common)
    if family == "mistral":
        return hf.MistralConfig(sliding_window=24, **common)
    if family == "gemma2":
        return hf.Gemma2Config(head_dim=64, sliding_window=24, attn_logit_softcapping=5.0, **common)
    raise ValueError(family)


def build(hf, family: str, impl: str, dtype: torch.dtype):
    torch.manual_seed(0)
    cfg = gpu_config(hf, family)
    model = hf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    return model.to(device="cuda", dtype=dtype).eval()


def padded_batch(lengths: list[int], seq: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (len(lengths), seq), generator=g)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, seq - n :] = 1
    return ids.cuda(), mask.cuda()


def kernels_only(fn):
    """Run ``fn`` and fail if attnc fell back to the reference."""
    import attnc.integrations.transformers as backend

    backend._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    fallbacks = [str(w.message) for w in caught if "generated PyTorch reference" in str(w.message)]
    assert not fallbacks, fallbacks
    return result


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_logits_within_the_bf16_eager_error(hf, family):
    ids, mask = padded_batch([64, 41, 7, 64], 64)
    valid = mask.bool()
    exact = build(hf, family, "eager", torch.float32)(ids, attention_mask=mask).logits[valid]
    eager16 = build(hf, family, "eager", torch.bfloat16)(ids, attention_mask=mask).logits
    attnc16 = build(hf, family, "attnc", torch.bfloat16)
    got = kernels_only(lambda: attnc16(ids, attention_mask=mask).logits)
    eager_err = (eager16[valid].float() - exact).abs().max().item()
    err = (got[valid].float() - exact).abs().max().item()
    assert err <= 4 * eager_err + 1e-3, (err, eager_err)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral"])
def test_greedy_generate_follows_the_float32_model(hf, family):
    ids, mask = padded_batch([48, 30, 9], 48)
    new = 16
    exact = build(hf, family, "eager", torch.float32)
    eager16 = build(hf, family, "eager", torch.bfloat16)
    attnc16 = build(hf, family, "attnc", torch.bfloat16)
    kwargs = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    tokens = kernels_only(lambda: attnc16.generate(ids, **kwargs))
    assert tokens.shape == (3, 48 + new)
    full_mask = torch.cat([mask, torch.ones_like(tokens[:, 48:])], dim=1)
    logits = exact(tokens, attention_mask=full_mask).logits[:, 47:-1].float()
    logits16 = eager16(tokens, attention_mask=full_mask).logits[:, 47:-1].float()
    tol = 4 * (logits16 - logits).abs().max().item() + 1e-3
    chosen = logits.gather(-1, tokens[:, 48:, None]).squeeze(-1)
    margin = logits.max(dim=-1).values - chosen
    assert margin.max().item() <= tol, (margin.max().item(), tol)


def step_logits(model, ids: torch.Tensor, mask: torch.Tensor, prompt: int) -> torch.Tensor:
    """Float32 logits of the tokens after ``prompt``, run as one call over the prompt's cache."""
    first = model(ids[:, :prompt], attention_mask=mask[:, :prompt], use_cache=True)
    return model(
        ids[:, prompt:], attention_mask=mask, past_key_values=first.past_key_values, use_cache=True
    ).logits.float()


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma2"])
@pytest.mark.parametrize("step", [1, 3])
def test_decode_steps_over_the_cache_in_place(hf, family, step, monkeypatch):
    """Calls of ``step`` new tokens over a left-padded cache run the decode wrapper (in place,
    not packed) with logits within the bf16 eager error of float32 eager."""
    import attnc.integrations.transformers as backend

    calls = []
    real = backend.run_decode_kernels

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(backend, "run_decode_kernels", counted)
    ids, mask = padded_batch([64, 41, 7], 64 + step)
    mask[:, 64:] = 1
    results = {}
    for name, impl, dtype in (("exact", "eager", torch.float32),
                              ("eager16", "eager", torch.bfloat16),
                              ("attnc16", "attnc", torch.bfloat16)):  # fmt: skip
        model = build(hf, family, impl, dtype)
        run = lambda m=model: step_logits(m, ids, mask, 64)  # noqa: E731
        results[name] = kernels_only(run) if impl == "attnc" else run()
    eager_err = (results["eager16"] - results["exact"]).abs().max().item()
    err = (results["attnc16"] - results["exact"]).abs().max().item()
    assert calls and all(calls), calls  # every layer of the step ran the decode wrapper
    assert err <= 4 * eager_err + 1e-3, (err, eager_err)


@torch.no_grad()
def test_gemma2_shaped_decode_at_head_dim_256(hf):
    """Gemma-2's own head_dim (256) with a window shorter than the cache, one decode step."""
    common = dict(hidden_size=512, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=VOCAB,
                  max_position_embeddings=1024, sliding_window=100,
                  attn_logit_softcapping=50.0)  # fmt: skip
    ids, mask = padded_batch([300, 170], 301)
    mask[:, 300:] = 1
    logits = {}
    for impl, dtype in (("eager", torch.float32), ("eager", torch.bfloat16),
                        ("attnc", torch.bfloat16)):  # fmt: skip
        torch.manual_seed(0)
        model = (
            hf.AutoModelForCausalLM.from_config(hf.Gemma2Config(**common), attn_implementation=impl)
            .to(device="cuda", dtype=dtype)
            .eval()
        )
        run = lambda m=model: step_logits(m, ids, mask, 300)  # noqa: E731
        logits[(impl, dtype)] = kernels_only(run) if impl == "attnc" else run()
    exact = logits[("eager", torch.float32)]
    eager_err = (logits[("eager", torch.bfloat16)] - exact).abs().max().item()
    err = (logits[("attnc", torch.bfloat16)] - exact).abs().max().item()
    assert err <= 4 * eager_err + 1e-3, (err, eager_err)


@torch.no_grad()
def test_gpt_oss_sinks_within_the_bf16_eager_error(hf):
    """gpt-oss (sinks on full and sliding layers) through the kernels: a decode step after a
    prompt run by the prefill kernel. Fails naming the gap when a kernel ignores sinks."""
    from attnc.integrations.hf_sinks import sink_kernel_gap, sink_support_gap

    if sink_support_gap() is not None:
        pytest.skip(f"attnc without sinks: {sink_support_gap()}")
    gap = sink_kernel_gap(torch.device("cuda"), torch.bfloat16, 64)
    assert gap is None, gap
    cfg = hf.GptOssConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          vocab_size=VOCAB, num_local_experts=2, num_experts_per_tok=1,
                          sliding_window=24, max_position_embeddings=256)  # fmt: skip
    ids, mask = padded_batch([64, 41, 7], 65)
    mask[:, 64:] = 1
    logits = {}
    for impl, dtype in (("eager", torch.float32), ("eager", torch.bfloat16),
                        ("attnc", torch.bfloat16)):  # fmt: skip
        torch.manual_seed(0)
        model = hf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
        model = model.to(device="cuda", dtype=dtype).eval()
        run = lambda m=model: step_logits(m, ids, mask, 64)  # noqa: E731
        logits[(impl, dtype)] = kernels_only(run) if impl == "attnc" else run()
    exact = logits[("eager", torch.float32)]
    eager_err = (logits[("eager", torch.bfloat16)] - exact).abs().max().item()
    err = (logits[("attnc", torch.bfloat16)] - exact).abs().max().item()
    assert err <= 4 * eager_err + 1e-3, (err, eager_err)
