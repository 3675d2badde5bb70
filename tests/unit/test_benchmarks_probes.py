"""The probes' argument checks and reports, without a GPU: ``timing_probe``'s row syntax,
``clock_probe``'s and ``burst_probe``'s rows and ``stress_prefill``'s parent (its children
are replaced by canned results)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import clock_probe, stress_prefill, timing_probe


def test_timing_probe_rows_parse_with_params():
    assert timing_probe.parse_row("causal:8192:128") == ("causal", 8192, 128, {})
    assert timing_probe.parse_row("sliding_window:4096:64:window=1024:cap=2.5") == (
        "sliding_window", 4096, 64, {"window": 1024, "cap": 2.5},
    )  # fmt: skip


def test_timing_probe_fa3_rows_parse_like_attnc_rows():
    assert timing_probe.parse_row("fa3/softcap:8192:128:cap=30") == (
        "softcap", 8192, 128, {"cap": 30},
    )  # fmt: skip


@pytest.mark.parametrize(
    "spec, words",
    [
        ("fa3/prefix_lm:8192:128", "fa3/ rows are causal, softcap, sliding_window"),
        ("fa3/causal:8k:128", "positive integers"),
        ("causal:8192", "is not variant:len:head_dim"),
        ("causal:8k:128", "positive integers"),
        ("causal:0:128", "positive integers"),
        ("causal:8192:128:window", "'window' is not param=number"),
        ("causal:8192:128:window=abc", "'window=abc' is not param=number"),
        ("causal:8192:128:=3", "'=3' is not param=number"),
    ],
)
def test_timing_probe_bad_rows_name_the_part(spec, words):
    with pytest.raises(ValueError, match=words) as err:
        timing_probe.parse_row(spec)
    assert repr(spec) in str(err.value)


@pytest.mark.parametrize("spec", ["gemm:8192", "causal:8192:128", "prefix_lm:64:64:prefix_len=8"])
def test_clock_probe_accepts_gemm_and_prefill_rows(spec):
    clock_probe.check_row(spec)


@pytest.mark.parametrize(
    "spec, words",
    [("gemm:", "positive integer"), ("gemm:0", "positive integer"), ("gemm:8k", "positive"),
     ("causal:8192", "is not variant:len:head_dim")],
)  # fmt: skip
def test_clock_probe_bad_rows_name_the_row(spec, words):
    with pytest.raises(ValueError, match=words) as err:
        clock_probe.check_row(spec)
    assert repr(spec) in str(err.value)


@pytest.mark.parametrize(
    "module, rows, bad",
    [("benchmarks.clock_probe", "gemm:8192,gemm:x", "gemm:x"),
     ("benchmarks.burst_probe", "causal:8192:128,causal:x:128", "causal:x:128")],
)  # fmt: skip
def test_probe_checks_rows_before_any_gpu_work(module, rows, bad):
    """A bad row is an argparse error (exit 2) naming it, before torch is touched or any row
    is planned."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--rows", rows], capture_output=True, text=True
    )
    assert done.returncode == 2 and repr(bad) in done.stderr


def _run_parent(monkeypatch, capsys, argv, outcome):
    """stress_prefill's parent over ``argv`` with every child answered by ``outcome``."""
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return outcome(cmd, kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["stress_prefill", *argv])
    stress_prefill.main()
    return calls, capsys.readouterr().out.splitlines()


def test_stress_reports_ok_hang_and_fail(monkeypatch, capsys):
    def outcome(cmd, timeout):
        name = cmd[cmd.index("--child") + 1]
        if name == "prefix_lm":
            raise subprocess.TimeoutExpired(cmd, timeout)
        if name == "alibi":
            return subprocess.CompletedProcess(cmd, 1, "", "warning\nRuntimeError: boom\n")
        if name == "softcap":
            return subprocess.CompletedProcess(cmd, 0, "0.9000 differs\n", "")
        return subprocess.CompletedProcess(cmd, 0, "attnc: building\n0.8512 same\n", "warn\n")

    argv = ["--variants", "causal,prefix_lm,alibi,softcap", "--calls", "7", "--deadline", "5"]
    calls, lines = _run_parent(monkeypatch, capsys, argv, outcome)
    assert [c[c.index("--child") + 1] for c in calls] == ["causal", "prefix_lm", "alibi", "softcap"]
    assert all(c[c.index("--calls") + 1] == "7" for c in calls)
    assert lines[0].split() == ["causal", "ok:", "7", "calls,", "0.8512", "ms", "per", "call"]
    assert "HANG" in lines[1] and "7 calls did not finish in 5 s" in lines[1]
    assert lines[2].startswith("alibi") and lines[2].endswith("FAIL: RuntimeError: boom")
    assert lines[3].startswith("softcap") and "DIFFERS: the output of call 8" in lines[3]


def test_stress_rejects_unknown_variants_before_any_child(monkeypatch, capsys):
    def outcome(cmd, timeout):
        raise AssertionError("no child may start")

    with pytest.raises(SystemExit):
        _run_parent(monkeypatch, capsys, ["--variants", "causal,nope"], outcome)
    assert "unknown ['nope']" in capsys.readouterr().err


def test_fa3_rows_take_the_stdlib_defaults_and_name_a_missing_param():
    """An fa3/ row computes what the attnc row of the same spec does: soft-cap's cap defaults
    to the variant's 50 (it used to default to 30), and a window must be given."""
    import attnc

    softcap = attnc.load("stdlib:softcap")
    assert timing_probe._with_defaults("fa3/softcap:64:64", softcap, {})["cap"] == 50.0
    assert timing_probe._with_defaults("fa3/softcap:64:64", softcap, {"cap": 30})["cap"] == 30
    window = attnc.load("stdlib:sliding_window")
    with pytest.raises(ValueError, match="give window"):
        timing_probe._with_defaults("fa3/sliding_window:64:64", window, {})


def test_timing_probe_gives_alibi_its_slopes():
    """An alibi row failed in run() for want of its tensor param; the probe passes the
    standard slopes for every query head."""
    torch = pytest.importorskip("torch")
    import attnc

    got = timing_probe.probe_tensor_params("alibi", 32, "cpu")
    tensors = {p.name for p in attnc.load("stdlib:alibi").params if p.default is None}
    assert tensors <= set(got)
    expected = torch.tensor([2.0 ** (-8.0 * h / 32) for h in range(1, 33)])
    torch.testing.assert_close(got["slopes"], expected, rtol=0, atol=0)
    assert timing_probe.probe_tensor_params("causal", 32, "cpu") == {}


def test_timing_probe_gives_gpt_oss_local_its_sinks():
    """A gpt_oss_local row needs its sink logits (no default); the probe passes one f32 per
    query head, the same values on every call (trees timed against each other agree)."""
    torch = pytest.importorskip("torch")
    import attnc

    got = timing_probe.probe_tensor_params("gpt_oss_local", 32, "cpu")
    tensors = {p.name for p in attnc.load("stdlib:gpt_oss_local").params if p.default is None}
    assert tensors <= set(got)
    assert got["sinks"].shape == (32,) and got["sinks"].dtype == torch.float32
    again = timing_probe.probe_tensor_params("gpt_oss_local", 32, "cpu")
    torch.testing.assert_close(got["sinks"], again["sinks"], rtol=0, atol=0)


def test_prefill_run_host_times_launching_calls_and_restores_the_checks():
    from attnc.runtime.checks import tensors
    from benchmarks import prefill_run_host

    check = tensors.check_data_tensor
    result = prefill_run_host.measure("causal", 64, 20)  # raises unless every call launched
    assert set(result) == {"run_us", "run_out_us", "checked_us", "checked_out_us"}
    assert all(0 < us < 1e5 for us in result.values())
    assert tensors.check_data_tensor is check


def test_predecessor_probe_takes_each_rounds_row_kernels_by_position():
    from benchmarks import predecessor_probe

    # rounds of one predecessor kernel (10 ms) then two row kernels
    times = [10.0, 1.0, 2.0, 10.0, 1.5, 2.5, 10.0, 0.5, 0.5]
    assert predecessor_probe.row_ms(times, 1, 2, 3) == [1.0, 3.0, 4.0]
    assert predecessor_probe.row_ms([4.0, 5.0], 0, 1, 2) == [4.0, 5.0]


@pytest.mark.parametrize("times, k_pred, k_row, calls", [([1.0] * 8, 1, 2, 3), ([], 0, 0, 2)])
def test_predecessor_probe_rejects_kernel_counts_that_do_not_fit(times, k_pred, k_row, calls):
    from benchmarks import predecessor_probe

    with pytest.raises(ValueError, match="expected"):
        predecessor_probe.row_ms(times, k_pred, k_row, calls)


@pytest.mark.parametrize(
    "args, words",
    [(["--patterns", "none,bogus"], "'bogus' is not one of"), (["--calls", "3"], "at least 4"),
     (["--rows", "gemm,causal:8k:128"], "positive integers")],
)  # fmt: skip
def test_predecessor_probe_bad_arguments_exit_2_before_gpu_work(args, words):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.predecessor_probe", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert words in done.stderr


def test_checked_read_cost_twins_differ_only_in_the_check():
    """The probe's ``checked`` variant holds one bounds-checked read and ``proven`` none, so
    the two time the check; ``no_read`` reads nothing; ``log_bias`` reads as ``proven``
    does."""
    from attnc.compiler.index_range import checked_loads
    from attnc.compiler.pipeline import compile_source
    from benchmarks import checked_read_cost

    compiled, _ = compile_source(checked_read_cost.SOURCE, "checked_read_cost")
    by_name = {c.variant.name: c for c in compiled}
    assert tuple(by_name) == checked_read_cost.VARIANTS
    counts = {name: len(list(checked_loads(c.variant))) for name, c in by_name.items()}
    assert counts == {"no_read": 0, "proven": 0, "checked": 1, "log_bias": 0}


def test_checked_read_cost_bad_arguments_exit_2_before_gpu_work():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.checked_read_cost", "--rounds", "0"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--rounds" in done.stderr
