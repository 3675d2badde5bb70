"""Decode steps of the transformers backend over the cache tensors in place (CPU tier).

``attnc.BatchDecodeWrapper`` is stood in for by a CPU class that runs the reference over the
pages its plan names, so these tests check what the CUDA path hands the wrapper: the paged
HND view of transformers' cache (no copy), the page table (left padding, sliding windows,
static caches), one plan per step and kind of layer, and the tokens of greedy ``generate()``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.unit.test_transformers_backend import (
    _RaggedWrapperStandIn,
    padded_batch,
    tiny_model,
)


@pytest.fixture(scope="module")
def hf():
    """transformers with the attnc backend registered, one intra-op thread."""
    transformers = pytest.importorskip("transformers")
    import attnc.integrations.transformers  # noqa: F401  (registers "attnc")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield transformers
    torch.set_num_threads(threads)


class _Layout:
    max_pages = 1 << 20
    max_batch = 256


class DecodeWrapperStandIn:
    """``attnc.BatchDecodeWrapper`` on the CPU: the reference over each request's pages."""

    plans: list[dict] = []
    caches: list[tuple[int, int]] = []  # (k storage pointer, v storage pointer) per run

    def __init__(self, variant, workspace, kv_layout="NHD", max_batch_size=256):
        assert kv_layout == "HND" and workspace.dtype == torch.uint8
        self.variant, self.layout = variant, _Layout()

    def plan(self, kv_indptr, kv_indices, last, hq, hkv, head_dim, page_size, *,
             q_len_per_request, sm_scale, dtype):  # fmt: skip
        assert kv_indptr.dtype == kv_indices.dtype == last.dtype == torch.int32
        assert page_size == 1 and bool((last == 1).all())
        self.indptr, self.ids = kv_indptr.tolist(), kv_indices.long()
        self.q_len, self.sm_scale = q_len_per_request, sm_scale
        DecodeWrapperStandIn.plans.append(
            dict(batch=len(self.indptr) - 1, q_len=q_len_per_request, pages=self.indptr[-1])
        )

    def run(self, q, kv, **params):
        k_cache, v_cache = kv
        assert k_cache.shape[2:] == (1, q.shape[2])
        assert int(self.ids.max()) < k_cache.shape[0] and k_cache.stride() == v_cache.stride()
        DecodeWrapperStandIn.caches.append(
            (k_cache.untyped_storage().data_ptr(), v_cache.untyped_storage().data_ptr())
        )
        outs = []
        for b in range(len(self.indptr) - 1):
            rows = self.ids[self.indptr[b] : self.indptr[b + 1]]
            qb = q[b * self.q_len : (b + 1) * self.q_len]
            k, v = k_cache[rows, :, 0], v_cache[rows, :, 0]
            outs.append(self.variant.reference(qb, k, v, sm_scale=self.sm_scale, **params))
        return torch.cat(outs)


@pytest.fixture
def stand_ins(monkeypatch):
    """Both batch wrappers stood in for, and the kernels' blocker off."""
    import attnc
    import attnc.integrations.hf_decode as hf_decode
    import attnc.integrations.transformers as backend

    monkeypatch.setattr(backend, "_kernel_blocker", lambda query, head_dim: None)
    monkeypatch.setattr(attnc, "BatchPrefillWrapper", _RaggedWrapperStandIn, raising=False)
    monkeypatch.setattr(attnc, "BatchDecodeWrapper", DecodeWrapperStandIn, raising=False)
    monkeypatch.setattr(hf_decode, "_pools", {})
    _RaggedWrapperStandIn.plans = []
    DecodeWrapperStandIn.plans, DecodeWrapperStandIn.caches = [], []


@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral"])
def test_decode_steps_plan_once_per_kind_and_match_eager(hf, stand_ins, family):
    model = tiny_model(hf, family, "eager")
    ids, mask = padded_batch([10, 4, 7], 10)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    model.set_attn_implementation("attnc")
    with torch.no_grad():
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    kinds = 2 if family == "gemma2" else 1
    assert len(_RaggedWrapperStandIn.plans) == kinds  # the prompt only
    assert len(DecodeWrapperStandIn.plans) == 3 * kinds  # 3 decode steps
    assert all(p["batch"] == 3 and p["q_len"] == 1 for p in DecodeWrapperStandIn.plans)
    full = [p["pages"] for p in DecodeWrapperStandIn.plans][kinds - 1 :: kinds]
    if family == "llama":  # the valid keys only: prompts + generated tokens, no padding
        assert full == [(10 + 4 + 7) + 3 * s for s in (1, 2, 3)]
    if family in ("gemma2", "mistral"):  # sliding layers read at most `window` keys per row
        sliding = [p["pages"] for p in DecodeWrapperStandIn.plans][::kinds]
        assert all(n <= 3 * 6 for n in sliding)


def test_decode_reads_the_cache_in_place(hf, stand_ins):
    """The wrapper gets views of the cache transformers passes, not copies."""
    model = tiny_model(hf, "llama", "attnc")
    ids, mask = padded_batch([6, 3], 6)
    seen = []

    def record(module, query, key, value, *args, **kwargs):
        seen.append((key.untyped_storage().data_ptr(), value.untyped_storage().data_ptr()))
        return forward(module, query, key, value, *args, **kwargs)

    import attnc.integrations.transformers as backend

    forward = backend.attnc_attention_forward
    hf.AttentionInterface.register("attnc_recorded", record)
    hf.AttentionMaskInterface.register("attnc_recorded", backend.attnc_mask)
    model.set_attn_implementation("attnc_recorded")
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                       pad_token_id=0)  # fmt: skip
    decode_calls = seen[-len(DecodeWrapperStandIn.caches) :]
    assert DecodeWrapperStandIn.caches and DecodeWrapperStandIn.caches == decode_calls


def test_static_cache_decode_matches_eager(hf, stand_ins):
    """A static cache hands the whole preallocated buffer; the table names the valid keys."""
    model = tiny_model(hf, "llama", "eager")
    ids, mask = padded_batch([9, 5], 9)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                  cache_implementation="static")  # fmt: skip
    expected = model.generate(ids, **kwargs)
    model.set_attn_implementation("attnc")
    got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    assert [p["pages"] for p in DecodeWrapperStandIn.plans] == [14 + 2 * s for s in (1, 2, 3)]


def test_token_pages_of_a_strided_cache():
    """Page ids and the view over a cache slice with a longer row stride (fp64, exact)."""
    from attnc.integrations.hf_decode import token_pages
    from attnc.integrations.hf_masks import BatchSegments, RowSegment

    buf = torch.randn(2, 3, 11, 8, dtype=torch.float64)
    key, value = buf[:, :, :9], buf[:, :, 2:11] * 1  # a slice, and a contiguous copy
    segs = BatchSegments(2, 1, 9, (RowSegment(0, 0, 1, 2, 9), RowSegment(1, 0, 1, 0, 5)), None)
    pages = token_pages(key, key, segs, window=4)
    assert pages is not None and pages.row_pages == 3 * 11
    assert pages.kv_indptr.tolist() == [0, 4, 8]
    assert pages.kv_indices.tolist() == [5, 6, 7, 8, 34, 35, 36, 37]
    for b, lo, hi in ((0, 5, 9), (1, 1, 5)):
        rows = pages.kv_indices[4 * b : 4 * b + 4].long()
        assert torch.equal(pages.k_pages[rows, :, 0], key[b, :, lo:hi].transpose(0, 1))
    assert token_pages(key, value, segs, None) is None  # K and V strides differ


def test_a_cpu_decode_step_runs_the_reference_over_the_pages(hf):
    """Without the stand-ins (the CPU path) decode steps still give eager's tokens."""
    model = tiny_model(hf, "qwen2", "sdpa")
    ids, mask = padded_batch([8, 3], 8)
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    model.set_attn_implementation("attnc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)


def test_a_step_beyond_the_wrappers_capacity_is_packed(hf, stand_ins, monkeypatch):
    """A plan that raises CapacityError: the step falls back to the packed prefill path once
    per kind (not once per layer) and the tokens stay eager's."""
    from attnc.runtime.planning.workspace import CapacityError

    attempts = []

    def refuse(self, *args, **kwargs):
        attempts.append(1)
        raise CapacityError("decode plan: needs more work items")

    monkeypatch.setattr(DecodeWrapperStandIn, "plan", refuse)
    model = tiny_model(hf, "gemma2", "eager")
    ids, mask = padded_batch([8, 5], 8)
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    model.set_attn_implementation("attnc")
    with torch.no_grad():
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    assert len(attempts) == 2 * 2  # 2 decode steps x 2 kinds
    assert len(_RaggedWrapperStandIn.plans) == 3 * 2  # the prompt and both steps, packed


def test_token_pages_refuse_what_the_kernels_cannot_read():
    """Misaligned starts, token strides that are not whole 16-byte chunks, and batch strides
    that are not a whole number of tokens give None (the call is packed instead)."""
    from attnc.integrations.hf_decode import token_pages
    from attnc.integrations.hf_masks import segments_without_mask

    segs = segments_without_mask(2, 1, 6)
    buf = torch.randn(2 * 3 * 6 * 8 + 1, dtype=torch.float16)
    shifted = buf[1:].view(2, 3, 6, 8)  # starts 2 bytes past an aligned address
    assert token_pages(shifted, shifted, segs, None) is None
    narrow = torch.randn(2, 3, 6, 4, dtype=torch.float16)  # 8-byte tokens
    assert token_pages(narrow, narrow, segs, None) is None
    base = torch.randn(1000, dtype=torch.float16)
    odd = base.as_strided((2, 3, 6, 8), (3 * 6 * 16 + 8, 6 * 16, 16, 1))  # 296 % 16 != 0
    assert token_pages(odd, odd, segs, None) is None
    fine = torch.randn(2, 3, 6, 8, dtype=torch.float16)
    pages = token_pages(fine, fine, segs, None)
    assert pages is not None and pages.kv_indices.tolist() == [*range(6), *range(18, 24)]
