"""Key values staged by the Hopper producer (sm90/staged_keys.cuh) against the float64 reference.

A variant that reads tensors at indices of kv_idx alone (a bias or a document id per key) gets
``V::KeyValues``; its Hopper kernel has the producer write each stage's key values into shared
memory and the consumers read them there. Each case here runs such a variant through
``BatchPrefillWrapper`` on both templates over a batch with tail tiles, a query long enough for
the three-consumer shape, and KV that is ragged (TMA), paged by 16 (TMA boxes per page) or
paged by 5 (the cp.async gather): the three ways a stage is filled, each of which publishes the
values. The variants cover one field (an i32 document id), two (a bias and a document id: one
16-byte load per pair of keys), three and eight reads summed into the score (one value a key),
eight separate conditions (32 bytes a key: too many to fit beside the stages, so the consumers
read them as before), a score that is not affine in S (the log2 form), and one without softmax
(the raw form). Accuracy rule as in tests/batch_check.py.

``ATTNC_TEST_SM90_FLAGS`` adds nvcc flags to the Hopper modules built here
(test_sm90_producer_lag.py reruns this file with lagging producer warps).
"""

from __future__ import annotations

import os

import pytest
import torch
from batch_check import check_batch
from key_value_cases import FIELDS, SOURCES, params_for, per_request, plan_and_run

import attnc
from attnc.runtime.build import jit, modules
from attnc.runtime.wrappers import prefill as prefill_wrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the Hopper template needs an sm_90 GPU", allow_module_level=True)

SM90_FLAGS = tuple(os.environ.get("ATTNC_TEST_SM90_FLAGS", "").split())
HQ, HKV, D = 8, 2, 128
# The 2100-token query takes the three-consumer shape; the others end in tail tiles.
Q_LENS, KV_LENS = [17, 1, 2100, 300], [17, 300, 2100, 2049]


@pytest.fixture(scope="module")
def built() -> dict[tuple[str, str], modules.PrefillModule]:
    """The Hopper and FA2 modules of every variant, built in one parallel batch."""
    from attnc.codegen.module import render_prefill_module, render_prefill_sm90_module

    specs, keys = [], []
    for name, source in SOURCES.items():
        ir = attnc.load(source=source).ir
        dtype = modules.dtype_name(torch.bfloat16)
        specs.append(jit.ModuleSpec(f"staged_{name}_sm90t", render_prefill_sm90_module(
            ir, dtype, D), SM90_FLAGS))  # fmt: skip
        specs.append(jit.ModuleSpec(f"staged_{name}_fa2t", render_prefill_module(
            ir, dtype, D), modules.prefill_arch_flags("90a")))  # fmt: skip
        keys += [(name, "sm90", ir), (name, "fa2", ir)]
    paths = jit.build_modules(specs, arch="90a")
    return {
        (name, kind): modules.load_prefill_module(path, ir, f"staged_{name}_{kind}")
        for (name, kind, ir), path in zip(keys, paths, strict=True)
    }


def _use_module(monkeypatch, module: modules.PrefillModule, kind: str) -> None:
    from attnc.runtime.build.backends import PrefillChoice

    def choose(ir, backend, *, head_dim, group, max_q_len, **_):
        return PrefillChoice(kind, module, module.tile_q_tokens(head_dim, group, max_q_len))

    monkeypatch.setattr(prefill_wrapper, "choose_prefill_module", choose)


def test_each_variant_has_key_values():
    for name, source in SOURCES.items():
        text = attnc.load(source=source).cuda_source
        assert "static constexpr bool kHasKeyValues = true;" in text, name
        fields = text.split("struct KeyValues {")[1].split("};")[0]
        assert fields.count(";") == FIELDS[name], (name, fields)


@pytest.mark.parametrize("layout", ["ragged", "paged16", "paged5"])
@pytest.mark.parametrize("kind", ["sm90", "fa2"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_staged_key_values_match_float64(built, monkeypatch, name, kind, layout):
    _use_module(monkeypatch, built[(name, kind)], kind)
    variant = attnc.load(source=SOURCES[name])
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(sum(Q_LENS), HQ, D, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(sum(KV_LENS), HKV, D, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(sum(KV_LENS), HKV, D, generator=gen).to("cuda", torch.bfloat16)
    params = params_for(name, KV_LENS, gen)
    w = BatchPrefillWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    o, lse = plan_and_run(w, q, k, v, Q_LENS, KV_LENS, layout, params, gen)
    assert w.planned_backend == kind
    check_batch(variant, q, k, v, o, lse, Q_LENS, KV_LENS, per_request(params, KV_LENS))
