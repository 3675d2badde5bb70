"""Which params the runtime treats as per-token tensors (first dim ``kv_len`` or ``q_len``):
a mask reading one needs a tile map, as the functor's ``kMaskReadsTokens`` says; a decode
wrapper gives a ``kv_len`` one ``kv_token_start`` at run time, and a decode ``plan()``
refuses it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import attnc
from attnc.codegen.functor import functor_traits
from attnc.runtime.checks import tensors
from attnc.runtime.planning.plan_params import variant_mask_reads
from attnc.runtime.wrappers import decode_plan_masks
from attnc.runtime.wrappers import decode_planning as D
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

TENSORS = """variant tokens_of_{name} {{
    param t: tensor<i32>[{dims}];
    mask = kv_idx <= q_pos && t[{index}] >= 0;
}}
"""
KINDS = {  # name -> (dims, first index, one value per KV token, one per token)
    "kv": ("kv_len", "kv_idx", True, True),
    "kv_rows": ("kv_len, 2", "kv_idx, 1", True, True),
    "q": ("q_len", "q_idx", False, True),
    "batch": ("batch_size", "batch", False, False),
    "fixed": ("64", "kv_idx % 64", False, False),
    "heads": ("num_qo_heads", "qo_head", False, False),
}


def _variant(name: str) -> attnc.Variant:
    dims, index, _, _ = KINDS[name]
    return attnc.load(source=TENSORS.format(name=name, dims=dims, index=index))


@pytest.mark.parametrize("name", sorted(KINDS))
def test_mask_reads_token_tensors_as_the_functor_says(name: str) -> None:
    variant = _variant(name)
    reads = variant_mask_reads(variant)
    assert reads.token_tensors == (("t",) if KINDS[name][3] else ())
    assert reads.needs_tile_map is functor_traits(variant.compiled).mask_reads_tokens
    constant = "true" if KINDS[name][3] else "false"
    assert f"kMaskReadsTokens = {constant};" in variant.cuda_source


@pytest.fixture
def cpu_init(monkeypatch):
    """BatchDecodeWrapper.__init__ on the CPU (no device properties, no pinned memory)."""
    real_bytes, real_zeros = tensors.workspace_bytes, torch.zeros
    monkeypatch.setattr(
        D.tensors, "workspace_bytes", lambda buf, require_cuda=False: real_bytes(buf)
    )
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=8)
    )
    monkeypatch.setattr(torch, "zeros", lambda *a, pin_memory=False, **k: real_zeros(*a, **k))

    def make(variant: attnc.Variant) -> BatchDecodeWrapper:
        return BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8))

    return make


@pytest.mark.parametrize("name", sorted(KINDS))
def test_kv_token_start_only_for_a_kv_len_tensor(cpu_init, name: str) -> None:
    assert cpu_init(_variant(name))._reads_kv_tokens is KINDS[name][2]


@pytest.mark.parametrize("name", ["doc_causal", "per_request_window", "gpt_oss_local"])
def test_kv_token_start_of_stdlib_variants(cpu_init, name: str) -> None:
    assert cpu_init(attnc.load(f"stdlib:{name}"))._reads_kv_tokens is (name == "doc_causal")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_decode_plan_refuses_only_kv_len_tensors(name: str) -> None:
    variant = _variant(name)
    given = {"t": object()}
    if not KINDS[name][2]:
        decode_plan_masks._refuse_per_key_tensors(variant, given)
        return
    with pytest.raises(ValueError, match=r"param 't' .*not a tensor of one value per KV token"):
        decode_plan_masks._refuse_per_key_tensors(variant, given)
    decode_plan_masks._refuse_per_key_tensors(variant, {})  # not given: nothing to refuse
