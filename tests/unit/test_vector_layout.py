"""q, K, V, out and the workspace as the kernels' 16-byte vector loads need them: a tensor at
an odd element offset or with strides off a multiple of 8 elements reached the launcher,
whose ATTNC_E_BAD_LAYOUT named no tensor. ``run()`` names it now, on the checked path and
when a remembered call meets such a tensor (on the CPU, with recording launchers)."""

from __future__ import annotations

import pytest
import torch

from attnc.runtime.checks import tensors
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401 (a fixture)
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _qkv, _ragged_plan, _wrapper, cpu_run  # noqa: F401


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` one element past a 16-byte boundary."""
    base = torch.empty(t.numel() + 8, dtype=t.dtype)
    view = base[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _padded_heads(t: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """A copy of ``t`` [n, heads, d] whose head stride is d + pad elements."""
    n, h, d = t.shape
    base = torch.zeros(n, h, d + pad, dtype=t.dtype)
    base[..., :d].copy_(t)
    return base[..., :d]


def test_the_layout_check_names_offset_and_strides() -> None:
    t = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    tensors.check_vector_layout((("q", t, 8), ("out", None, 2)))
    with pytest.raises(ValueError, match="^q: starts 2 bytes past a 16-byte boundary"):
        tensors.check_vector_layout((("q", _shifted(t), 8),))
    with pytest.raises(ValueError, match=r"^k: strides \[136, 68, 1\] are not all multiples of 8"):
        tensors.check_vector_layout((("k", _padded_heads(t), 8),))
    tensors.check_vector_layout((("out", _padded_heads(t, 2), 2),))  # O's multiple is 2 here


def test_a_workspace_off_a_16_byte_boundary_is_named() -> None:
    ws = torch.empty((1 << 20) + 16, dtype=torch.uint8)[3:]
    with pytest.raises(ValueError, match="^workspace_buffer: starts 3 bytes past"):
        tensors.workspace_bytes(ws)


@pytest.mark.parametrize("which", ["q", "k", "v", "out"])
@pytest.mark.parametrize("remembered", [False, True])
def test_prefill_run_names_a_misaligned_tensor(cpu_run, which, remembered) -> None:  # noqa: F811
    w, rec = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    out = torch.empty_like(q)
    if remembered:  # a checked call of the same shapes first: the next one is memoised
        w.run(q, (k, v), out=out)
    given = {"q": q, "k": k, "v": v, "out": out}
    given[which] = _shifted(given[which])
    calls = len(rec.calls)
    with pytest.raises(ValueError, match=f"^{which}: starts 2 bytes past a 16-byte boundary"):
        w.run(given["q"], (given["k"], given["v"]), out=given["out"])
    assert len(rec.calls) == calls


def test_prefill_run_names_a_head_stride_off_the_multiple(cpu_run) -> None:  # noqa: F811
    w, rec = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    with pytest.raises(ValueError, match=r"^q: strides \[.*\] are not all multiples of 8"):
        w.run(_padded_heads(q), (k, v))
    w.run(_padded_heads(q, 8), (k, v))  # a head stride of d + 8 is fine
    assert len(rec.calls) == 1


@pytest.mark.parametrize("which", ["q", "out"])
@pytest.mark.parametrize("remembered", [False, True])
def test_decode_run_names_a_misaligned_tensor(cpu_decode, which, remembered) -> None:  # noqa: F811
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    out = torch.empty_like(q)
    if remembered:
        w.run(q, cache, out=out)
    given = {"q": q, "out": out}
    given[which] = _shifted(given[which])
    calls = len(w._module.calls)
    with pytest.raises(ValueError, match=f"^{which}: starts 2 bytes past a 16-byte boundary"):
        w.run(given["q"], cache, out=given["out"])
    assert len(w._module.calls) == calls
    with pytest.raises(ValueError, match="^kv: starts 2 bytes past a 16-byte boundary"):
        w.run(q, _shifted(cache))


def test_out_stride_multiples_are_two_for_prefill_and_four_for_decode(
    cpu_run,  # noqa: F811
    cpu_decode,  # noqa: F811
) -> None:
    """O's head stride need be a multiple of 2 elements for prefill, of 4 for decode."""
    w, rec = _wrapper("causal")
    tq, tkv = _ragged_plan(w)
    q, k, v = _qkv(tq, tkv)
    w.run(q, (k, v), out=_padded_heads(torch.empty_like(q), 2))
    assert len(rec.calls) == 1
    d = cpu_decode("vanilla")
    q, cache = _inputs()
    with pytest.raises(ValueError, match=r"^out: strides \[.*\] are not all multiples of 4"):
        d.run(q, cache, out=_padded_heads(torch.empty_like(q), 2))
    d.run(q, cache, out=_padded_heads(torch.empty_like(q), 4))
    assert len(d._module.calls) == 1
