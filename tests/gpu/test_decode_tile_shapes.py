"""Decode tile shapes beyond 16 rows at d=128 against the float64 reference: head_dim 256
(16-row tiles, two row blocks when a request packs more than 16 rows) and 32-row tiles
(q_len 8 x GQA 4 at d=64 and d=128), split and unsplit, identity / affine / general scores,
masks and normalize = none. Same accuracy rule as test_decode.py."""

import pytest
import torch
from test_decode import MIXED, WORKSPACE, Batch, _check_accuracy, _params

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CASES = [
    # (variant, head_dim, q_len, dtype, rows per item the plan must pick, layout, page size)
    ("vanilla", 256, 1, torch.bfloat16, 16, "NHD", 16),
    ("softcap", 256, 3, torch.float16, 16, "HND", 5),
    ("alibi", 256, 5, torch.bfloat16, 16, "NHD", 16),
    ("sliding_window", 256, 2, torch.bfloat16, 16, "HND", 16),
    ("causal", 128, 8, torch.bfloat16, 32, "NHD", 5),
    ("alibi", 128, 8, torch.float16, 32, "HND", 16),
    ("sigmoid", 128, 8, torch.bfloat16, 32, "NHD", 16),
    ("prefix_lm", 64, 8, torch.bfloat16, 32, "HND", 16),
    ("softcap", 64, 7, torch.float16, 32, "NHD", 5),
]


@pytest.mark.parametrize("name,d,q_len,dtype,rows,layout,page_size", CASES)
def test_decode_tile_shape(name, d, q_len, dtype, rows, layout, page_size):
    batch = Batch(MIXED, page_size, layout, q_len, dtype=dtype, d=d, seed=d + q_len)
    variant = attnc.load(f"stdlib:{name}")
    ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = BatchDecodeWrapper(variant, ws, kv_layout=layout)
    batch.plan(wrapper)
    shape = getattr(wrapper, "_shape", None)
    if shape is not None:
        assert shape.rows_per_item == rows
    params = _params(name)
    o, lse = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    o2, lse2 = wrapper.run(batch.q, batch.cache, return_lse=True, **params)
    assert torch.equal(o, o2) and torch.equal(lse, lse2), "not bit-identical run to run"
    _check_accuracy(variant, batch, params, o, lse)
