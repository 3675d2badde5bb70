"""FA4 anchor: the keywords per row, their semantics (fp64), and, where flash-attn-4 and
the CuTe DSL are importable, the ALiBi score_mod and FA4's sm90 compile (no GPU needed)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from benchmarks import fa4_anchor, flex_anchor, workloads
from benchmarks.outcome import Unsupported
from benchmarks.workloads import VARIANTS, PrefillCase


def _case(key: str, q_len: int = 2048, kv_len: int = 2048, **kw) -> PrefillCase:
    return PrefillCase(VARIANTS[key], q_len, kv_len, **kw)


def test_fa4_rows_map_to_flash_attn_func_keywords():
    assert fa4_anchor.fa4_call(_case("causal")).kwargs == {"causal": True}
    soft = fa4_anchor.fa4_call(_case("softcap"))
    assert soft.kwargs == {"causal": True, "softcap": 30.0} and not soft.alibi
    window = fa4_anchor.fa4_call(_case("sliding_window"))
    # window 1024 keeps q_pos - kv_idx < 1024: FA4's left window is 1023, right 0, causal
    assert window.kwargs == {"causal": True, "window_size": (1023, 0)}
    alibi = fa4_anchor.fa4_call(_case("alibi"))
    assert alibi.alibi and alibi.kwargs == {"causal": True, "pack_gqa": False}
    full = fa4_anchor.fa4_call(_case("sigmoid"))
    assert full.stand_in and full.kwargs == {"causal": False} and "not compared" in full.note


def test_fa4_cannot_express_prefix_lm():
    with pytest.raises(Unsupported, match="mask_mod"):
        fa4_anchor.fa4_call(_case("prefix_lm"))


def test_fa4_and_flash_cover_every_prefill_row_but_the_listed_ones():
    """Every full-profile row gets a call or an Unsupported, never another exception."""
    fa4_rows, flash_rows = set(), set()
    for case in workloads.prefill_cases(full=True):
        try:
            fa4_anchor.fa4_call(case)
            fa4_rows.add(case.variant.stdlib)
        except Unsupported:
            pass
        try:
            flex_anchor.flash_backend_call(case)
            flash_rows.add(case.variant.stdlib)
        except Unsupported:
            pass
    assert fa4_rows == {"causal", "softcap", "alibi", "sliding_window", "sigmoid"}
    assert flash_rows == {"causal", "softcap", "alibi", "sliding_window", "prefix_lm"}


def _fa4_reference(q, k, v, call, num_heads, offset):
    """float64 attention with FA4's semantics for a call (q/k/v [L, H, D], bottom-right)."""
    import math

    import torch

    q_len, kv_len, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(q.shape[-1])
    q_idx = torch.arange(q_len)[:, None]
    kv_idx = torch.arange(kv_len)[None, :]
    kw = call.kwargs
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    if call.alibi:  # what alibi_score_mod computes: 2^(-8 (h + 1) / H) * (kv - q - offset)
        slopes = torch.pow(2.0, -8.0 * torch.arange(1, num_heads + 1).double() / num_heads)
        s = s + slopes[:, None, None] * (kv_idx - q_idx - offset)
    keep = torch.ones(q_len, kv_len, dtype=torch.bool)
    if kw.get("causal"):  # FA's causal and windows are bottom-right aligned
        keep &= kv_idx <= q_idx + offset
    if "window_size" in kw:
        left, right = kw["window_size"]
        keep &= (kv_idx >= q_idx + offset - left) & (kv_idx <= q_idx + offset + right)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)


@pytest.mark.parametrize("key", ["causal", "softcap", "alibi", "sliding_window"])
@pytest.mark.parametrize("shape", [(37, 37), (9, 40)])
def test_fa4_semantics_match_the_benchmark_reference(key, shape):
    """The keywords FA4 gets compute the row's function (fp64 on small shapes)."""
    import torch

    from benchmarks.inputs import variant_params
    from benchmarks.workloads import Mask, VariantSpec
    from tests.unit.test_benchmarks_anchor_mods import _reference_attention

    variant = VARIANTS[key]
    if key == "sliding_window":  # a window narrower than the shape, so it cuts
        variant = VariantSpec("w", "sliding_window", Mask("window", window=5), (("window", 5),))
    q_len, kv_len = shape
    case = PrefillCase(variant, q_len, kv_len, num_qo_heads=4, num_kv_heads=2, head_dim=8)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(q_len, 4, 8, generator=gen)
    k, v = (torch.randn(kv_len, 2, 8, generator=gen) for _ in range(2))
    params = variant_params(variant, 4, device="cpu")
    call = fa4_anchor.fa4_call(case)
    got = _fa4_reference(q, k, v, call, 4, kv_len - q_len)
    want = _reference_attention(q, k, v, variant, params)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


ALIBI_KERNEL = textwrap.dedent(
    """
    import cutlass
    import cutlass.cute as cute

    from benchmarks.fa4_anchor import alibi_score_mod

    HEADS, HEAD, Q_IDX, KV_IDX, OFFSET, SCORE = 32, 3, 5, 2, 7, 1.5
    MOD = alibi_score_mod(HEADS, OFFSET)


    @cute.jit
    def filled(dtype: cutlass.Constexpr, value: cutlass.Constexpr):
        frag = cute.make_rmem_tensor(4, dtype)
        frag.fill(value)
        return frag.load()


    @cute.kernel
    def kernel(out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        i32 = cutlass.Int32
        got = MOD(
            filled(cutlass.Float32, SCORE), filled(i32, 0), filled(i32, HEAD),
            q_idx=filled(i32, Q_IDX), kv_idx=filled(i32, KV_IDX), seqlen_info=None,
            aux_tensors=(),
        )
        res = cute.make_rmem_tensor(4, cutlass.Float32)
        res.store(got)
        out[tidx] = res[0]


    @cute.jit
    def host(out: cute.Tensor):
        kernel(out).launch(grid=[1, 1, 1], block=[32, 1, 1])


    def build():
        cute.compile(host, cute.runtime.make_fake_compact_tensor(cutlass.Float32, (32,)))
    """
)


def test_fa4_alibi_score_mod_compiles_to_the_alibi_bias(tmp_path, monkeypatch):
    """With the CuTe DSL importable (no GPU needed), compile a kernel applying the ALiBi
    score_mod to constants for sm_90a and read the folded result from its PTX."""
    import importlib
    import re
    import struct

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_KEEP", "ptx")
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", str(tmp_path))
    pytest.importorskip("cutlass.cute")
    (tmp_path / "fa4_alibi_kernel.py").write_text(ALIBI_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    kern = importlib.import_module("fa4_alibi_kernel")
    assert fa4_anchor.alibi_score_mod(kern.HEADS, kern.OFFSET) is kern.MOD
    kern.build()
    ptx = "".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    stored = re.findall(r"st\.global\.b32\s+\[[^\]]+\],\s*(-?\d+);", ptx)
    assert len(stored) == 1
    value = struct.unpack("<f", struct.pack("<i", int(stored[0])))[0]
    slope = 2.0 ** (-8.0 * (kern.HEAD + 1) / kern.HEADS)
    want = kern.SCORE + slope * (kern.KV_IDX - kern.Q_IDX - kern.OFFSET)
    assert value == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("key", ["alibi", "sigmoid", "sliding_window"])
def test_fa4_call_compiles_for_sm90_on_fake_tensors(key, monkeypatch):
    """With flash-attn-4 and the CuTe DSL importable (no GPU needed), the call FA4 gets for
    a row compiles FA4's whole sm90 forward kernel: under FakeTensorMode FA4 compiles and
    skips the launch."""
    import types

    import torch

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    try:
        import triton  # noqa: F401  (quack's autotuner imports it; only the import is needed)
    except ImportError:
        stub = types.ModuleType("quack.autotuner")
        stub.autotune = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
        stub.AutotuneConfig = type(  # type: ignore[attr-defined]
            "AutotuneConfig", (), {"__init__": lambda self, *a, **k: None}
        )
        monkeypatch.setitem(sys.modules, "quack.autotuner", stub)
    interface = pytest.importorskip("flash_attn.cute.interface")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.inputs import DenseData

    monkeypatch.setattr(interface, "_get_device_arch", lambda: 90)
    monkeypatch.setattr(interface, "get_num_sms_for_selection", lambda *a, **k: 132)
    case = _case(key, 1024, 1024)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1024, 32, 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty(1024, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in "kv")
        prep = fa4_anchor.Fa4Prefill().prepare(case, DenseData(q, k, v, {}))
        out = prep.run()
    assert tuple(out.shape) == (1, 1024, 32, 128)
    assert prep.compare == (key != "sigmoid")
