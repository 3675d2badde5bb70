"""Measuring one case: cross-checks before timing, self-checks, not-run systems (no GPU)."""

from __future__ import annotations

import pytest

from benchmarks.outcome import Missing, Unsupported


class _FakeSystem:
    """A system returning a fixed tensor (or raising), for the cross-check logic."""

    graph = False

    def __init__(self, name, out=None, exc=None, is_attnc=False):
        self.name, self.out, self.exc, self.is_attnc = name, out, exc, is_attnc

    def prepare(self, case, data):
        from benchmarks.system import Prepared

        if self.exc is not None:
            raise self.exc
        return Prepared(lambda: self.out)


def test_not_run_systems_show_as_missing(monkeypatch):
    import torch

    from benchmarks import measure
    from benchmarks.cli import parse_args
    from benchmarks.suites import _keep

    args = parse_args(["--no-fa3"])
    systems = _keep([_FakeSystem("flashinfer_fa3"), _FakeSystem("flex", torch.ones(2))], args)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (1.0, ""))
    out = measure.measure_case(None, systems, [None], 1e12, log=lambda _: None)
    assert out["flashinfer_fa3"].status == "missing" and "notes" in out["flashinfer_fa3"].note
    assert "--no-fa3" in args.not_run["flashinfer_fa3"]  # the reason, given once in the notes
    assert _keep([_FakeSystem("flashinfer_fa3")], parse_args(["--skip", "flashinfer_fa3"])) == []
    assert _keep([_FakeSystem("flashinfer_fa3")], parse_args(["--skip", "fa3"])) == []


def test_measure_case_cross_checks_before_timing(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (2.0, ""))
    ref = torch.randn(64, 4)
    systems = [
        _FakeSystem("fi", exc=Missing("flashinfer: ImportError")),
        _FakeSystem("flex", ref),
        _FakeSystem("sdpa", exc=Unsupported("only causal")),
        _FakeSystem("bad", ref + 1.0),
        _FakeSystem("nan", torch.full_like(ref, float("nan"))),
        _FakeSystem("attnc", ref + 1e-4, is_attnc=True),
    ]
    out = measure.measure_case(None, systems, [None], 4e12, log=lambda _: None)
    assert [out[n].status for n in ("fi", "flex", "sdpa", "bad", "nan", "attnc")] == [
        "missing",
        "ok",
        "n/a",
        "mismatch",
        "mismatch",
        "ok",
    ]
    assert out["attnc"].value == pytest.approx(2000.0)
    assert out["flex"].note == "reference"


def test_measure_case_reports_attnc_errors(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (1.0, ""))
    systems = [
        _FakeSystem("flex", torch.ones(3)),
        _FakeSystem("attnc", exc=ImportError("no module named attnc.runtime"), is_attnc=True),
    ]
    out = measure.measure_case(None, systems, [None], 1e12, log=lambda _: None)
    assert out["attnc"].status == "error"
    assert out["attnc"].note.startswith("ImportError")
    assert out["flex"].note == "unchecked"


def test_single_output_uses_self_check(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (1.0, ""))
    good = _FakeSystem("attnc", torch.ones(3), is_attnc=True)
    good.self_check = lambda case, data, out: 1e-3
    out = measure.measure_case(None, [good], [None], 1e12, log=lambda _: None)
    assert out["attnc"].status == "ok" and out["attnc"].note == "vs eager reference, last rows"
    good.self_check = lambda case, data, out: 0.5
    out = measure.measure_case(None, [good], [None], 1e12, log=lambda _: None)
    assert out["attnc"].status == "mismatch"


def test_attnc_self_check_slices_bottom_right_rows():
    import torch

    from benchmarks.attnc_systems import AttncPrefill, load_variant
    from benchmarks.inputs import DenseData
    from benchmarks.workloads import VARIANTS, PrefillCase

    try:
        variant = load_variant("sliding_window")
    except Exception as exc:  # the runtime may not import on this machine
        pytest.skip(f"attnc.load unavailable: {exc}")
    case = PrefillCase(
        VARIANTS["sliding_window"], 40, 64, num_qo_heads=4, num_kv_heads=2, head_dim=16
    )
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(40, 4, 16, generator=gen)
    k, v = (torch.randn(64, 2, 16, generator=gen) for _ in range(2))
    data = DenseData(q, k, v, {"window": 9})
    full = variant.reference(q, k, v, window=9)
    assert AttncPrefill().self_check(case, data, full, rows=8) < 1e-6


def test_rotation_count_exceeds_flush_size():
    from benchmarks.timing import rotation_count

    assert rotation_count(1 << 30) == 1
    assert rotation_count(96 << 20) == 3
    assert rotation_count(1 << 20) == 4
