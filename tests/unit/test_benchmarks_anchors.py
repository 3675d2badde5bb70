"""Stand-ins and child-timed systems in a row, attnc's per-template columns, the FA3 build
budget (CPU only: no GPU, no FA4, no FlashInfer)."""

from __future__ import annotations

import pytest

from benchmarks import report
from benchmarks.outcome import Missing, Outcome
from benchmarks.workloads import VARIANTS, PrefillCase


def _case(key: str, q_len: int = 2048, kv_len: int = 2048, **kw) -> PrefillCase:
    return PrefillCase(VARIANTS[key], q_len, kv_len, **kw)


class _Sys:
    graph = False

    def __init__(self, name, out, *, compare=True, timed_ms=None, is_attnc=False, retime=None):
        self.name, self.out, self.compare, self.timed_ms = name, out, compare, timed_ms
        self.is_attnc = is_attnc
        self.timed_elsewhere = timed_ms is not None
        self.prepared_sets = 0
        self.retime = retime

    def prepare(self, case, data):
        from benchmarks.system import Prepared

        self.prepared_sets += 1
        return Prepared(
            lambda: self.out, compare=self.compare, timed_ms=self.timed_ms, retime=self.retime
        )


def test_stand_in_is_timed_not_compared_and_child_time_is_used(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (2.0, ""))
    ref = torch.randn(16, 4)
    stand_in = _Sys("fa4", ref * 5, compare=False, timed_ms=1.0)
    systems = [stand_in, _Sys("attnc", ref, is_attnc=True)]
    monkeypatch.setattr(systems[1], "self_check", lambda c, d, o: 0.0, raising=False)
    out = measure.measure_case(None, systems, [None, None, None], 4e12, log=lambda _: None)
    assert out["fa4"].status == "ok" and out["fa4"].value == pytest.approx(4000.0)
    assert out["fa4"].rel_err is None and stand_in.prepared_sets == 1
    assert out["fa4"].stand_in and not out["attnc"].stand_in
    assert out["attnc"].status == "ok" and out["attnc"].note == "vs eager reference, row blocks"


def test_two_attnc_templates_without_anchor_check_the_first_against_eager(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (2.0, ""))
    ref = torch.randn(16, 4)
    fa2, sm90 = _Sys("attnc-fa2", ref, is_attnc=True), _Sys("attnc-sm90", ref + 1, is_attnc=True)
    fa2.self_check = lambda c, d, o: 1e-3  # type: ignore[attr-defined]
    out = measure.measure_case(None, [fa2, sm90], [None], 4e12, log=lambda _: None)
    assert out["attnc-fa2"].status == "ok" and "eager" in out["attnc-fa2"].note
    assert out["attnc-sm90"].status == "mismatch" and "attnc-fa2" in out["attnc-sm90"].note


def test_backend_detection_needs_a_named_parameter():
    from benchmarks.attnc_systems import takes_backend

    def named(q, k, v, *, backend="fa2", **params): ...

    def kwargs_only(q, k, v, **params): ...

    class Wrapper:
        def __init__(self, variant, workspace, kv_layout="NHD", backend=None): ...

    assert takes_backend(named) and takes_backend(Wrapper)
    assert not takes_backend(kwargs_only) and not takes_backend(42)


def test_prefill_lists_show_one_attnc_system_per_backend(monkeypatch):
    from benchmarks import attnc_systems, suites
    from benchmarks.cli import parse_args

    args = parse_args([])
    monkeypatch.setattr(attnc_systems, "prefill_backends", lambda batch=False: ("fa2", "sm90"))
    names = [s.name for s in suites.prefill_systems(args)]
    assert names == [
        "flashinfer_fa3", "flashinfer_fa2", "fa4", "flex", "flex_flash", "sdpa_cudnn",
        "sdpa_flash", "attnc-fa2", "attnc-sm90",
    ]  # fmt: skip
    batch = [s.name for s in suites.batch_prefill_systems(args)]
    assert batch == ["flashinfer_fa3", "flashinfer_fa2", "attnc-fa2", "attnc-sm90"]
    monkeypatch.setattr(attnc_systems, "prefill_backends", lambda batch=False: (None,))
    assert [s.name for s in suites.prefill_systems(args)][-1] == "attnc"


def test_attnc_backend_reaches_prefill_and_wrapper(monkeypatch):
    import types

    from benchmarks import attnc_systems

    calls = []
    variant = types.SimpleNamespace(prefill=lambda q, k, v, **kw: calls.append(kw) or "out")
    monkeypatch.setattr(attnc_systems, "load_variant", lambda name: variant)
    data = types.SimpleNamespace(q=1, k=2, v=3, params={"cap": 30.0})
    for backend, want in (("sm90", {"cap": 30.0, "backend": "sm90"}), (None, {"cap": 30.0})):
        prep = attnc_systems.AttncPrefill(backend).prepare(_case("softcap"), data)
        assert prep.run() == "out" and calls[-1] == want


def test_this_runtime_is_detected_without_error():
    from benchmarks.attnc_systems import prefill_backends

    for batch in (False, True):
        assert prefill_backends(batch) in (("fa2", "sm90"), (None,))


def test_report_with_two_attnc_columns():
    def ok(v):
        return Outcome("ok", value=v).to_dict()

    row = {
        "case": "causal, L=8192",
        "unit": "TFLOP/s",
        "higher_is_better": True,
        "systems": {"fa4": ok(700.0), "attnc-fa2": ok(350.0), "attnc-sm90": ok(735.0)},
    }
    assert report.columns([row]) == ["attnc-fa2", "attnc-sm90", "fa4"]
    assert report.best_anchor(row) == ("fa4", 700.0)
    assert report.ratio_cells(row, {"matmul_tflops": 700.0}) == (
        "fa2 0.50x fa4; sm90 1.05x fa4",
        "fa2 50%; sm90 105%",
    )
    text = report.render_suite("prefill", [row], {})
    assert "| attnc-fa2 | attnc-sm90 | fa4 |" in text


def test_jit_builds_skip_a_build_that_does_not_fit():
    from benchmarks.budget import JitBuilds

    builds = JitBuilds(50.0, "FlashInfer FA3")
    builds.admit("causal", None)  # no limit
    builds.admit("softcap", 61.0)
    with pytest.raises(Missing, match="~50 s.*40 s left"):
        builds.admit("window", 40.0)
    builds.admit("softcap", 1.0)  # built before: no new build
    with pytest.raises(Missing, match="0 s left"):
        builds.admit("alibi", -5.0)


def test_flashinfer_fa3_asks_the_suite_clock(monkeypatch):
    import types

    from benchmarks import flashinfer_anchor
    from benchmarks.budget import JitBuilds

    monkeypatch.setattr(flashinfer_anchor, "FA3_BUILDS", JitBuilds(50.0, "FlashInfer FA3"))
    monkeypatch.setattr(flashinfer_anchor, "flashinfer", lambda: types.SimpleNamespace())
    late = flashinfer_anchor.FlashInferSingle("fa3", lambda: 10.0)
    with pytest.raises(Missing, match="does not fit"):
        late.prepare(_case("causal"), None)
    fa2 = flashinfer_anchor.FlashInferSingle("fa2", lambda: 10.0)
    assert fa2.prepare(_case("causal"), None).run is not None  # FA2 is not held back
    keys = {
        flashinfer_anchor.module_key("single", 128, flashinfer_anchor.variant_kwargs(v, "fa3"))
        for v in (VARIANTS["causal"], VARIANTS["softcap"], VARIANTS["sliding_window"])
    }
    assert len(keys) == 3


def test_cooldown_idles_before_each_system_is_timed(monkeypatch):
    """Under the power cap the system timed last ran at lower clocks: each system now gets
    the same idle pause before its timing (before its preparation when it times itself)."""
    import torch

    from benchmarks import measure

    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def bench(fns, graph=False, rep=100):
        events.append("time")
        return 2.0, ""

    monkeypatch.setattr(measure, "bench_ms", bench)
    ref = torch.randn(16, 4)
    child = _Sys("fa4", ref, compare=False, timed_ms=1.0)
    systems = [_Sys("fa3", ref), child, _Sys("attnc", ref, is_attnc=True)]
    sleep = lambda s: events.append(f"sleep {s}")  # noqa: E731
    out = measure.measure_case(
        None, systems, [None], 4e12, log=lambda _: None, cooldown_s=0.5, sleep=sleep
    )
    assert all(o.status == "ok" for o in out.values())
    # the child's pause precedes the preparations; each other system's precedes its timing
    assert events == ["sleep 0.5", "sleep 0.5", "time", "sleep 0.5", "time"]
    events.clear()
    measure.measure_case(None, systems, [None], 4e12, log=lambda _: None, sleep=sleep)
    assert events == ["time", "time"]


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "61"])
def test_cli_cooldown_defaults_to_one_second_and_rejects_bad_pauses(capsys, bad):
    """A negative, NaN, infinite (a sleep for ever) or huge pause is refused up front."""
    from benchmarks import cli

    assert cli.parse_args([]).cooldown == 1.0
    assert cli.parse_args(["--cooldown", "0"]).cooldown == 0.0
    with pytest.raises(SystemExit):
        cli.parse_args(["--cooldown", bad])
    assert "--cooldown must be between 0 and 60 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["benchmarks.timing_probe", "benchmarks.lang_v2_bench"])
def test_probes_refuse_an_infinite_pause_before_any_gpu_work(module):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", module, "--cooldown", "inf"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--cooldown must be between 0 and 60" in proc.stderr


def test_bench_ms_pauses_before_timing_when_asked(monkeypatch):
    """``pause_s`` idles the GPU (synchronise, then sleep) before do_bench starts."""
    import sys
    import types

    import torch

    from benchmarks import timing

    events: list[str] = []
    testing = types.SimpleNamespace(
        do_bench=lambda fn, warmup, rep, return_mode: events.append("bench") or 1.5
    )
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(testing=testing))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(f"sleep {s}"))
    assert timing.bench_ms([lambda: None], pause_s=0.75) == (1.5, "")
    assert events == ["sync", "sleep 0.75", "bench"]
    events.clear()
    assert timing.bench_ms([lambda: None]) == (1.5, "")
    assert events == ["bench"]


def test_rounds_alternate_the_order_and_take_the_median(monkeypatch):
    """Round 0 times the systems in column order, round 1 in reverse, round 2 in order again;
    each figure is the median of its rounds, and a child-timed system is timed once."""
    import torch

    from benchmarks import measure

    order: list[str] = []
    ms = {"fa3": iter([1.0, 3.0, 2.0]), "attnc": iter([2.0, 1.0, 4.0])}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def bench(fns, graph=False, rep=100):
        name = fns[0]()
        order.append(name)
        return next(ms[name]), ""

    monkeypatch.setattr(measure, "bench_ms", bench)
    child = _Sys("fa4", "fa4", compare=False, timed_ms=4.0)
    fa3, ours = _Sys("fa3", "fa3", compare=False), _Sys("attnc", "attnc", compare=False)
    out = measure.measure_case(None, [fa3, child, ours], [None], 4e12, log=lambda _: None, rounds=3)
    assert order == ["fa3", "attnc", "attnc", "fa3", "fa3", "attnc"]
    assert out["fa3"].value == pytest.approx(2000.0) and "median of 3 rounds" in out["fa3"].note
    assert out["attnc"].value == pytest.approx(2000.0)
    assert out["fa4"].value == pytest.approx(1000.0)


def test_a_child_system_that_can_retime_is_timed_in_every_round(monkeypatch):
    """The anchor child's system takes its turn in each round (after the same pause as the
    others), and its figure is the median of those rounds, not of its preparation's timing."""
    import torch

    from benchmarks import measure

    order: list[str] = []
    ms = {"fa3": iter([1.0, 1.0, 1.0]), "fa4": iter([4.0, 2.0, 3.0])}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def bench(fns, graph=False, rep=100):
        order.append(fns[0]())
        return next(ms["fa3"]), ""

    def retime():
        order.append("fa4")
        return next(ms["fa4"]), ""

    sleeps: list[float] = []
    monkeypatch.setattr(measure, "bench_ms", bench)
    child = _Sys("fa4", "fa4", compare=False, timed_ms=9.0, retime=retime)
    fa3 = _Sys("fa3", "fa3", compare=False)
    out = measure.measure_case(
        None, [child, fa3], [None], 4e12, log=lambda _: None, rounds=3, cooldown_s=0.5,
        sleep=sleeps.append,
    )  # fmt: skip
    assert order == ["fa4", "fa3", "fa3", "fa4", "fa4", "fa3"]
    assert out["fa4"].value == pytest.approx(4e12 / 3e-3 / 1e12)  # median 3.0 ms, not 9.0
    assert "median of 3 rounds" in out["fa4"].note
    assert len(sleeps) == 1 + 6  # before the child's preparation, then before every timing


def test_a_child_retime_that_fails_makes_the_system_an_error(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def retime():
        raise RuntimeError("child gone")

    child = _Sys("fa4", "fa4", compare=False, timed_ms=1.0, retime=retime)
    out = measure.measure_case(None, [child], [None], 4e12, log=lambda _: None, rounds=2)
    assert out["fa4"].status == "error" and "child gone" in out["fa4"].note


def test_a_round_that_fails_makes_the_system_an_error(monkeypatch):
    import torch

    from benchmarks import measure

    calls = iter([(1.0, ""), RuntimeError("launch failed")])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def bench(fns, graph=False, rep=100):
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    monkeypatch.setattr(measure, "bench_ms", bench)
    out = measure.measure_case(
        None, [_Sys("attnc", "x", compare=False)], [None], 4e12, log=lambda _: None, rounds=2
    )
    assert out["attnc"].status == "error" and "launch failed" in out["attnc"].note


def test_cli_rounds_must_be_positive(capsys):
    from benchmarks import cli

    assert cli.parse_args([]).rounds == 1
    with pytest.raises(SystemExit):
        cli.parse_args(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_suite_rows_time_with_the_run_settings(monkeypatch):
    """Every suite's rows pass --rep, --cooldown and --rounds on to measure_case."""
    from benchmarks import cli, measure, suites

    seen = {}

    def fake(case, systems, sets, work, **kw):
        seen.update(kw)
        return {}

    monkeypatch.setattr(measure, "measure_case", fake)
    args = cli.parse_args(["--cooldown", "0.5", "--rounds", "3", "--rep", "7"])
    suites._measure(None, [], [None], 1.0, args, print)
    assert seen["cooldown_s"] == 0.5 and seen["rounds"] == 3 and seen["rep"] == 7


@pytest.mark.parametrize("rows", ["foo", "sinks,docs", ","])
def test_lang_v2_bench_refuses_unknown_row_groups_before_any_gpu_work(rows):
    """``--rows`` names groups; an unknown one (or none) is a usage error naming it and the
    groups there are, before any GPU work."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.lang_v2_bench", "--rows", rows],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "groups are documents, windows, sinks" in proc.stderr
    bad = [g for g in rows.split(",") if g] or ["nothing"]
    assert all(g in proc.stderr for g in bad)
