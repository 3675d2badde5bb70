"""The benchmark command line: profiles, --skip, --only, time budgets (no GPU)."""

from __future__ import annotations

import pytest

from benchmarks import workloads


def test_cli_help_works_without_gpu(capsys):
    from benchmarks.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "--suite" in capsys.readouterr().out
    args = parse_args(["--suite", "all", "--quick", "--skip", "flex,sdpa_flash"])
    assert args.suites == ["prefill", "decode", "host", "batch", "jit"]
    assert args.skip == {"flex", "sdpa_flash"}
    assert args.quick and args.rep == 25


def test_profiles_and_fa3_default():
    from benchmarks.cli import parse_args

    fast = parse_args([])
    assert fast.profile == "fast" and not fast.quick and not fast.full and fast.rep == 40
    assert fast.suites == ["prefill", "decode", "host", "batch", "jit"]
    assert not fast.not_run  # FlashInfer FA3 runs by default
    full = parse_args(["--full", "--fa3", "--suite", "decode", "jit"])
    assert full.full and full.rep == 100 and not full.not_run
    assert "flashinfer_fa3" in parse_args(["--no-fa3"]).not_run
    assert parse_args(["--skip", "fa3,flex_flash"]).skip == {"flashinfer_fa3", "flex_flash"}
    assert parse_args(["--skip", "cudnn, sdpa_flash,"]).skip == {"sdpa_cudnn", "sdpa_flash"}
    assert full.suites == ["decode", "jit"]
    assert parse_args(["--profile", "quick"]).quick


def test_suite_shares_pass_unused_time_on():
    from benchmarks.budget import WEIGHTS, suite_share

    suites = ["prefill", "decode", "host", "batch", "jit"]
    total = 300.0
    first = suite_share("prefill", suites, total)
    assert first == pytest.approx(total * WEIGHTS["prefill"] / sum(WEIGHTS.values()))
    # prefill used only half its share: the rest is split over the later suites
    left = total - first / 2
    later = sum(WEIGHTS[s] for s in suites[1:])
    assert suite_share("decode", suites[1:], left) == pytest.approx(
        left * WEIGHTS["decode"] / later
    )
    assert suite_share("decode", suites[1:], left) > first * WEIGHTS["decode"] / WEIGHTS["prefill"]
    assert suite_share("jit", ["jit"], 40.0) == 40.0
    assert suite_share("jit", ["jit"], -3.0) == 0.0


def test_suite_clock_skips_rows_that_would_overrun():
    from benchmarks.budget import SuiteClock

    now = [0.0]
    clock = SuiteClock(100.0, clock=lambda: now[0])
    assert clock.may_start()
    clock.start()
    now[0] = 60.0
    clock.stop()
    assert clock.may_start()  # 40 s left >= half of the 60 s mean
    now[0] = 75.0
    assert not clock.may_start()  # 25 s left < 30 s
    assert SuiteClock(None).may_start() and not SuiteClock(-1.0, clock=lambda: 0.0).may_start()


def test_budget_stops_new_rows(tmp_path):
    import time

    from benchmarks.cli import parse_args
    from benchmarks.results import Results
    from benchmarks.suites import out_of_time

    args = parse_args(["--budget", "5"])
    res = Results(str(tmp_path))
    case = workloads.prefill_cases(quick=True)[0]
    assert not out_of_time(args, "prefill", case, res, lambda _: None)
    args.deadline = time.monotonic() - 1
    assert out_of_time(args, "prefill", case, res, lambda _: None)
    assert "not run (time budget)" in (tmp_path / "bench.md").read_text()


def test_only_keeps_rows_matching_any_alternative():
    from benchmarks.suites import _selected
    from benchmarks.workloads import decode_cases, prefill_cases

    cases = prefill_cases() + decode_cases()
    names = [c.name for c in _selected(cases, "D=| page 1")]
    assert names == [
        "causal, L=8192 D=64",
        "causal, L=8192 D=256",
        "causal, batch 64 x 4096, page 1",
    ]
    assert _selected(cases, None) == cases
    assert [c.name for c in _selected(cases, "GQA 8")] == [
        "causal, L=8192 GQA 8",
        "causal, batch 64 x 4096, GQA 8",
    ]


@pytest.mark.parametrize(
    ("skip", "message"),
    [
        ("flash", "'flash' is ambiguous, name flex_flash or sdpa_flash"),
        ("fa3,cudnn2", "unknown system 'cudnn2'; systems: flashinfer_fa3"),
        ("attnc-sm91", "unknown system 'attnc-sm91'"),
        ("fa4,\x1b[31m", "unknown system '\\x1b[31m'"),
    ],
)
def test_skip_refuses_unknown_and_ambiguous_systems(capsys, skip, message):
    """A --skip entry that names no system (or two) stops the run before anything is timed,
    instead of timing every system; control characters are shown escaped."""
    from benchmarks.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--skip", skip])
    assert message in capsys.readouterr().err


def test_system_names_cover_every_system_of_the_suites(monkeypatch):
    from benchmarks import attnc_systems, cli, suites
    from benchmarks.cli import parse_args

    monkeypatch.setattr(attnc_systems, "prefill_backends", lambda batch=False: ("fa2", "sm90"))
    args = parse_args([])
    lists = [
        suites.prefill_systems(args),
        suites.decode_systems(False),
        suites.batch_prefill_systems(args),
    ]
    names = {s.name for systems in lists for s in systems} | {"attnc"}
    assert names == set(cli.SYSTEM_NAMES)


def test_only_refuses_a_text_in_no_row_of_the_run(capsys):
    """--only "D=64" in the fast profile (no head_dim rows) or a misspelt row stops the run
    with the rows it could have chosen; texts that each match a row of some selected suite
    pass, and suites without rows (host, jit) leave --only unchecked."""
    from benchmarks.cli import parse_args

    ok = parse_args(["--suite", "prefill", "batch", "--full", "--only", "L=8192|prefill_zipf"])
    assert ok.only == "L=8192|prefill_zipf"
    assert parse_args(["--suite", "host", "--only", "anything"]).only == "anything"
    for argv, text in (
        (["--suite", "prefill", "--only", "D=64"], "'D=64' is in no row of the fast profile"),
        (["--suite", "prefill", "--full", "--only", "D=64|prefil_zipf"], "'prefil_zipf'"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        err = capsys.readouterr().err
        assert text in err and "rows: causal, L=8192" in err


def test_only_shows_control_characters_escaped(capsys):
    from benchmarks.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--suite", "prefill", "--only", "L=\x1b[31m"])
    err = capsys.readouterr().err
    assert "'L=\\x1b[31m' is in no row" in err and "\x1b" not in err


def test_every_module_imports_without_gpu_or_triton():
    import importlib
    import pkgutil

    import benchmarks

    for info in pkgutil.iter_modules(benchmarks.__path__):
        if info.name != "__main__":
            importlib.import_module(f"benchmarks.{info.name}")


def test_the_targets_preset_names_rows_that_exist_and_yields_to_later_arguments():
    """--preset targets stands for issue 12's side-by-side arguments where it is written: its
    --only texts all name rows of the full profile (parse_args refuses one that names none),
    the arguments before it are replaced and those after it win."""
    from benchmarks.cli import parse_args, row_names

    args = parse_args(["--suite", "all", "--out", "o", "--preset", "targets"])
    assert args.suites == ["prefill", "batch"] and args.full and args.rounds == 2
    assert args.out == "o" and args.cooldown == 1.0
    assert args.skip == {
        "flashinfer_fa2", "flex", "flex_flash", "sdpa_flash", "sdpa_cudnn", "attnc-fa2"
    }  # fmt: skip
    rows = row_names(args)
    for wanted in ("ALiBi, L=8192", "causal, L=8192 D=64", "causal, L=2048", "prefill_zipf"):
        assert any(wanted in r for r in rows), (wanted, rows)
    later = parse_args(["--preset=targets", "--rounds", "3", "--cooldown", "0.5"])
    assert later.rounds == 3 and later.cooldown == 0.5 and later.suites == ["prefill", "batch"]


@pytest.mark.parametrize("argv", [["--preset", "nope"], ["--preset"], ["--preset=\x1b[31m"]])
def test_an_unknown_or_missing_preset_is_refused(argv, capsys):
    from benchmarks.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert "--preset" in err and "\x1b" not in err  # a control character is shown escaped
