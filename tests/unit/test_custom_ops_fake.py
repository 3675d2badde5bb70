"""The fake (meta) implementations of attnc's torch custom ops, which torch.compile uses to
trace them: output shapes and dtypes follow the inputs without running a kernel."""

import pytest
import torch

import attnc.runtime.wrappers.decode  # noqa: F401  (registers attnc::decode)
import attnc.runtime.wrappers.merge  # noqa: F401  (registers attnc::merge_state)
import attnc.runtime.wrappers.prefill_launch  # noqa: F401  (registers attnc::prefill)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_prefill_fake_shapes():
    q, k = meta(37, 8, 128), meta(50, 2, 128)
    o, lse = torch.ops.attnc.prefill(
        0, "unused", q, k, k, meta(1024, dtype=torch.uint8), [0] * 4, 0.1, [], [], [], True
    )
    assert (o.shape, o.dtype, o.device.type) == ((37, 8, 128), torch.bfloat16, "meta")
    assert (lse.shape, lse.dtype) == ((37, 8), torch.float32)
    _, no_lse = torch.ops.attnc.prefill(
        0, "unused", q, k, k, meta(1024, dtype=torch.uint8), [0] * 4, 0.1, [], [], [], False
    )
    assert no_lse.shape == (0,)


def test_decode_fake_shapes():
    q, cache = meta(12, 8, 64, dtype=torch.float16), meta(30, 16, 2, 64, dtype=torch.float16)
    o, lse = torch.ops.attnc.decode(0, q, cache, cache, [], [], [], True)
    assert (o.shape, o.dtype) == ((12, 8, 64), torch.float16)
    assert (lse.shape, lse.dtype) == ((12, 8), torch.float32)


def test_merge_state_fake_shapes():
    o, lse = torch.ops.attnc.merge_state(
        meta(5, 4, 128), meta(5, 4, dtype=torch.float32), meta(5, 4, 128),
        meta(5, 4, dtype=torch.float32),
    )  # fmt: skip
    assert (o.shape, lse.shape, lse.dtype) == ((5, 4, 128), (5, 4), torch.float32)


def test_merge_state_fake_refuses_states_on_two_devices():
    """States on meta and the CPU went to the fake op, which checked no device: the results
    came back one on meta, one on the CPU (four CPU states are refused: not cuda)."""
    import attnc

    o, lse = torch.randn(4, 2, 8), torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"^lse_a: must be on the device of o_a \(meta\), got cpu"):
        attnc.merge_state(o.to("meta"), lse, o, lse)


def test_single_prefill_fake_shapes():
    import attnc.runtime.wrappers.single_prefill  # noqa: F401  (registers attnc::single_prefill)

    q, k = meta(9, 8, 64), meta(20, 2, 64)
    o, lse = torch.ops.attnc.single_prefill(1, q, k, k, None, [], [2.0], [], True)
    assert (o.shape, lse.shape, lse.dtype) == ((9, 8, 64), (9, 8), torch.float32)
    _, no_lse = torch.ops.attnc.single_prefill(1, q, k, k, 0.5, [3], [], [], False)
    assert no_lse.shape == (0,)
