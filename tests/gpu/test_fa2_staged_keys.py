"""Key values staged by the FA2 prefill kernel (prefill_mainloop.cuh) against the float64
reference, in every FA2 tile shape.

A variant whose score reads key values (``V::KeyValues``, up to two fields) has the FA2 CTA
write each tile's values into a block beside its stage one tile ahead of its math, and the
score hooks read them there. The cases run such variants (key_value_cases.py: a bias and a
document id, three reads summed into one value, a sigmoid without softmax) and two that keep
their per-element reads (documents: a mask alone; eight conditions) through
``BatchPrefillWrapper(backend="fa2")`` at head_dim 64, 128 and 256, with batches whose longest
query picks each tile shape (16 packed rows on one warp, 64 on four, and the largest: its
stages of two S tiles on sm_90, so a block is read at an S tile's offset), over ragged KV and
KV paged by 5, with tail tiles, one-token queries and a long KV that the scheduler splits
into chunks. Accuracy rule as in tests/batch_check.py. Runs on any GPU the FA2 template serves.
"""

from __future__ import annotations

import pytest
import torch
from batch_check import check_batch
from key_value_cases import SOURCES, params_for, per_request, plan_and_run

import attnc
from attnc.runtime.build import jit, toolchain
from attnc.runtime.build.modules import PREFILL_MODULES
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV = 8, 2  # 4 query heads a KV head: packed rows = 4 x query tokens
# (query lengths, KV lengths) per tile shape: at most 16 packed rows, at most 64, and more.
BATCHES = {
    "one_warp": ([4, 1, 3], [300, 17, 129]),
    "four_warps": ([16, 9, 1], [300, 1000, 3000]),
    "largest": ([17, 1, 700, 300], [17, 300, 700, 2049]),
}
VARIANTS = ["doc", "bias_and_doc", "three_reads", "eight_terms", "sigmoid_by_key"]
HEAD_DIMS = [64, 128, 256]


@pytest.fixture(scope="module")
def fa2_modules() -> None:
    """Builds the FA2 modules of every case in one parallel batch (later calls hit the cache)."""
    arch = toolchain.current_arch()
    specs = [
        PREFILL_MODULES.spec(attnc.load(source=SOURCES[name]).ir, torch.bfloat16, d, arch)
        for name in VARIANTS
        for d in HEAD_DIMS
    ]
    jit.build_modules(specs, arch=arch)


@pytest.mark.parametrize("layout", ["ragged", "paged5"])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", VARIANTS)
def test_fa2_staged_key_values_match_float64(fa2_modules, name, head_dim, batch, layout):
    q_lens, kv_lens = BATCHES[batch]
    variant = attnc.load(source=SOURCES[name])
    gen = torch.Generator().manual_seed(5 + head_dim)
    q = torch.randn(sum(q_lens), HQ, head_dim, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(sum(kv_lens), HKV, head_dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(sum(kv_lens), HKV, head_dim, generator=gen).to("cuda", torch.bfloat16)
    params = params_for(name, kv_lens, gen)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = BatchPrefillWrapper(variant, ws, backend="fa2")
    o, lse = plan_and_run(w, q, k, v, q_lens, kv_lens, layout, params, gen)
    assert w.planned_backend == "fa2"
    check_batch(variant, q, k, v, o, lse, q_lens, kv_lens, per_request(params, kv_lens))
