"""The decoy check: an output nearer the row's variant without its score transform than the
variant is a mismatch, anchors included; correct bf16 outputs pass (CPU only)."""

from __future__ import annotations

import pytest
from fixed_system import FixedSystem as _Fixed

from benchmarks import measure

CAP = {"cap": 30.0}


def _variant_or_skip(stdlib: str):
    from benchmarks.attnc_systems import load_variant

    try:
        return load_variant(stdlib)
    except Exception as exc:  # the runtime may not import on this machine
        pytest.skip(f"attnc.load unavailable: {exc}")


def _softcap_row(length: int = 1024, heads: tuple = (8, 2), params: dict = CAP):
    """A soft-cap prefill case on the suite's kind of inputs (bf16 randn), on the CPU."""
    import torch

    from benchmarks.inputs import DenseData
    from benchmarks.workloads import VARIANTS, PrefillCase

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(length, heads[0], 128, generator=gen).bfloat16()
    k, v = (torch.randn(length, heads[1], 128, generator=gen).bfloat16() for _ in range(2))
    case = PrefillCase(VARIANTS["softcap"], length, length, heads[0], heads[1], 128)
    return case, DenseData(q, k, v, dict(params))


def _noisy(ref, scale: float = 1e-3, seed: int = 1):
    """A correct kernel's output: ``ref`` with ``scale`` relative noise, rounded to bf16."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return (ref.float() * (1 + scale * torch.randn(ref.shape, generator=gen))).bfloat16()


def _flash_like(q, k, v, cap: float | None):
    """Causal soft-cap attention as flash kernels compute it: float32 scores, P rounded to
    bf16 before P.V, bf16 output (no cap: ``cap`` None)."""
    import torch

    group = q.shape[1] // k.shape[1]
    kx, vx = (t.float().repeat_interleave(group, 1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.float(), kx) * q.shape[2] ** -0.5
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    n = q.shape[0]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    o = torch.einsum("hqk,khd->hqd", p.bfloat16().float(), vx) / p.sum(-1, keepdim=True)
    return o.permute(1, 0, 2).bfloat16()


def _measure(monkeypatch, case, data, systems) -> dict:
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (1.0, ""))
    return measure.measure_case(case, systems, [data], 1e12, log=lambda _: None)


def test_an_output_without_the_cap_is_a_mismatch_on_the_suites_inputs(monkeypatch):
    """Within the tolerance of the row's anchor (5e-3 apart), yet nearer plain causal
    attention than the soft-cap: attnc's cell is a mismatch."""
    softcap, causal = _variant_or_skip("softcap"), _variant_or_skip("causal")
    case, data = _softcap_row()
    right = _noisy(softcap.reference(data.q.float(), data.k.float(), data.v.float(), **CAP))
    wrong = causal.reference(data.q, data.k, data.v)
    assert 3e-3 < measure.rel_err(wrong, right) < measure.REL_TOL
    out = _measure(monkeypatch, case, data, [_Fixed("fi", right), _Fixed("attnc", wrong, True)])
    assert out["attnc"].status == "mismatch" and "without its score transform" in out["attnc"].note
    assert out["attnc"].decoy_pull == pytest.approx(1, abs=0.02)
    assert out["fi"].status == "ok" and out["fi"].decoy_pull == pytest.approx(0, abs=0.02)


def test_an_anchor_without_the_cap_is_a_mismatch_too(monkeypatch):
    """The reference anchor ignores the cap: it is flagged, attnc (right) is timed."""
    softcap, causal = _variant_or_skip("softcap"), _variant_or_skip("causal")
    case, data = _softcap_row()
    right = softcap.reference(data.q, data.k, data.v, **CAP)
    wrong = _noisy(causal.reference(data.q.float(), data.k.float(), data.v.float()))
    out = _measure(monkeypatch, case, data, [_Fixed("fi", wrong), _Fixed("attnc", right, True)])
    assert out["fi"].status == "mismatch" and "pull 1.0" in out["fi"].note
    assert out["attnc"].status == "ok" and out["attnc"].rel_err < measure.REL_TOL


def test_correct_bf16_outputs_pass_with_a_pull_near_zero(monkeypatch):
    """The eager reference in bf16, with 1e-3 and 2e-3 relative noise, and a flash-like
    kernel (P in bf16): every pull within 2e-2 of 0. The flash-like kernel without the cap is
    caught."""
    softcap = _variant_or_skip("softcap")
    case, data = _softcap_row(512)
    ref = softcap.reference(data.q.float(), data.k.float(), data.v.float(), **CAP)
    systems = [
        _Fixed("flash_like", _flash_like(data.q, data.k, data.v, 30.0)),
        _Fixed("bf16", ref.bfloat16()),
        _Fixed("noise_1e-3", _noisy(ref, 1e-3)),
        _Fixed("noise_2e-3", _noisy(ref, 2e-3, seed=2)),
        _Fixed("flash_no_cap", _flash_like(data.q, data.k, data.v, None), True),
    ]
    out = _measure(monkeypatch, case, data, systems)
    for name in ("flash_like", "bf16", "noise_1e-3", "noise_2e-3"):
        assert out[name].status == "ok", out[name]
        assert abs(out[name].decoy_pull) < 0.02
    assert out["flash_no_cap"].status == "mismatch" and out["flash_no_cap"].rel_err < 1e-2


def test_a_decode_row_without_the_cap_is_a_mismatch(monkeypatch):
    """Paged decode: each request's keys are gathered from its pages."""
    import torch

    from benchmarks.inputs import PagedData, page_table
    from benchmarks.workloads import VARIANTS, DecodeCase

    softcap, causal = _variant_or_skip("softcap"), _variant_or_skip("causal")
    lens = [300, 512, 77, 1024]
    case = DecodeCase(VARIANTS["softcap"], tuple(lens), num_qo_heads=8, num_kv_heads=2)
    indptr, indices, last, pages = page_table(lens, 16, seed=0)
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(pages, 2, 16, 2, 128, generator=gen).bfloat16()
    q = torch.randn(len(lens), 8, 128, generator=gen).bfloat16()
    qo = torch.arange(len(lens) + 1, dtype=torch.int32)
    data = PagedData(q, cache, qo, indptr, indices, last, lens, dict(CAP))
    right, wrong = [], []
    for b, n in enumerate(lens):
        pages = cache[indices[indptr[b] : indptr[b + 1]].long()]  # [pages, 2, 16, H, D]
        rows = pages.transpose(0, 1).flatten(1, 2)[:, :n]
        right.append(softcap.reference(q[b : b + 1], rows[0], rows[1], **CAP))
        wrong.append(causal.reference(q[b : b + 1], rows[0], rows[1]))
    systems = [_Fixed("fi", torch.cat(right)), _Fixed("attnc", torch.cat(wrong), True)]
    out = _measure(monkeypatch, case, data, systems)
    assert out["fi"].status == "ok" and abs(out["fi"].decoy_pull) < 0.02
    assert out["attnc"].status == "mismatch" and out["attnc"].decoy_pull > 0.9


def test_no_decoy_without_a_score_transform_or_a_gap():
    """Causal has no decoy. A cap of 1000 hardly bends the scores: the gap is below the
    floor, and there the bf16 rounding of an output moves its pull far from 0 or 1."""
    from benchmarks.decoy import DECOY_MIN_GAP, decoy_pulls, decoy_variant, decoy_verdicts

    softcap, causal = _variant_or_skip("softcap"), _variant_or_skip("causal")
    assert decoy_variant("causal") is None
    case, data = _softcap_row(256, (2, 1), {"cap": 1000.0})
    plain = causal.reference(data.q, data.k, data.v)
    assert decoy_variant("softcap").reference(data.q, data.k, data.v, cap=5.0).equal(plain)
    right = softcap.reference(data.q, data.k, data.v, cap=1000.0)
    pulls, gap = decoy_pulls(case, data, {"plain": plain, "right": right})
    assert gap < DECOY_MIN_GAP and abs(pulls["right"]) > 0.5
    assert decoy_verdicts(case, data, {"plain": plain, "right": right}) == {}


def test_a_failed_decoy_check_leaves_a_note(monkeypatch):
    import torch

    from benchmarks import decoy

    def broken(case, data, outputs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(decoy, "decoy_verdicts", broken)
    ref = torch.randn(8, 2, 4)
    out = _measure(monkeypatch, None, None, [_Fixed("fi", ref), _Fixed("attnc", ref, True)])
    assert out["attnc"].status == "ok" and "decoy unchecked (RuntimeError" in out["attnc"].note
    assert out["fi"].note.startswith("reference; decoy unchecked")
