"""Benchmark workloads, FLOP counting and report rendering (CPU only, no triton)."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import flops, report, workloads
from benchmarks.outcome import Missing, Outcome, Unsupported, from_exception
from benchmarks.workloads import Mask


def test_decode_zipf_matches_anchors():
    lens = workloads.decode_zipf()
    assert (len(lens), sum(lens), min(lens), max(lens)) == (64, 231_550, 1_176, 32_768)


def test_decode_uniform_matches_anchors():
    lens = workloads.decode_uniform()
    assert (len(lens), sum(lens), min(lens), max(lens)) == (64, 539_950, 512, 16_254)


def test_prefill_zipf_matches_anchors():
    lens = workloads.prefill_zipf()
    assert (len(lens), sum(lens)) == (16, 55_385)


def test_batch_cases_use_the_anchor_workloads():
    cases = workloads.batch_cases()
    assert [c.label for c in cases] == ["decode_zipf", "decode_uniform", "prefill_zipf"]
    assert sum(cases[0].kv_lens) == 231_550 and sum(cases[2].lens) == 55_385


def test_quick_suites_are_small():
    assert 1 <= len(workloads.prefill_cases(quick=True)) <= 2
    assert 1 <= len(workloads.decode_cases(quick=True)) <= 2
    assert 1 <= len(workloads.batch_cases(quick=True)) <= 2


def test_prefill_rows_cover_anchors():
    names = {c.name for c in workloads.prefill_cases()}
    for expected in (
        "causal, L=8192",
        "soft-cap 30, L=2048",
        "ALiBi, L=8192",
        "sliding window 1024, L=2048",
        "causal, L=8192 D=64",
        "causal, L=8192 D=256",
        "causal, L=8192 GQA 1",
        "causal, L=8192 GQA 8",
    ):
        assert expected in names


def _brute_pairs(mask: Mask, q_len: int, kv_len: int) -> int:
    """Count pairs by evaluating the mask on every (q_idx, kv_idx)."""
    total = 0
    for q_idx, kv_idx in itertools.product(range(q_len), range(kv_len)):
        q_pos = q_idx + kv_len - q_len
        causal = kv_idx <= q_pos
        keep = {
            "none": True,
            "causal": causal,
            "window": causal and q_pos - kv_idx < mask.window,
            "prefix": causal or kv_idx < mask.prefix,
        }[mask.kind]
        total += keep
    return total


MASKS = [
    Mask("none"),
    Mask("causal"),
    Mask("window", window=1),
    Mask("window", window=5),
    Mask("window", window=64),
    Mask("prefix", prefix=3),
    Mask("prefix", prefix=50),
]
SHAPES = [(1, 1), (7, 7), (33, 33), (5, 40), (1, 37), (16, 19), (40, 40)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: f"{m.kind}{m.window or m.prefix}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}kv{s[1]}")
def test_pair_count_matches_brute_force(mask, shape):
    q_len, kv_len = shape
    assert flops.pair_count(mask, q_len, kv_len) == _brute_pairs(mask, q_len, kv_len)


def test_prefill_flops_causal_closed_form():
    n, heads, dim = 8192, 32, 128
    expected = 4 * (n * (n + 1) // 2) * heads * dim
    assert flops.prefill_flops(Mask("causal"), n, n, heads, dim) == expected


def test_batch_prefill_flops_is_sum_of_requests():
    lens = [3, 10, 17]
    total = flops.batch_prefill_flops(Mask("causal"), lens, 2, 8)
    assert total == sum(4 * n * (n + 1) // 2 * 2 * 8 for n in lens)


def test_decode_bytes_read_k_and_v_once():
    assert flops.decode_kv_bytes([4096] * 64, 8, 128) == 2 * 64 * 4096 * 8 * 128 * 2
    window = Mask("window", window=1024)
    assert flops.decode_kv_bytes([4096, 500], 8, 128, mask=window) == 2 * 1524 * 8 * 128 * 2


def _fake_rows():
    ok = Outcome("ok", value=512.3).to_dict()
    return [
        {
            "case": "causal, L=8192",
            "unit": "TFLOP/s",
            "higher_is_better": True,
            "systems": {
                "flashinfer_fa3": ok,
                "flex": Outcome("ok", value=399.0).to_dict(),
                "sdpa_cudnn": Outcome("missing", note="flashinfer: ImportError").to_dict(),
                "attnc": Outcome("ok", value=600.0).to_dict(),
            },
        },
        {
            "case": "soft-cap 30, L=8192",
            "unit": "TFLOP/s",
            "higher_is_better": True,
            "systems": {
                "flashinfer_fa3": Outcome("missing", note="flashinfer: ImportError").to_dict(),
                "sdpa_cudnn": Outcome("n/a", note="only plain causal").to_dict(),
                "attnc": Outcome("error", note="RuntimeError: nvcc failed").to_dict(),
            },
        },
    ]


def test_report_shows_missing_not_zero():
    text = report.render_suite("prefill", _fake_rows(), {"matmul_tflops": 700.0})
    lines = text.splitlines()
    assert lines[2].split("|")[3].strip() == "attnc"
    assert "missing: flashinfer: ImportError" in text
    assert "error: RuntimeError: nvcc failed" in text
    assert "—" in text
    assert "1.17x flashinfer_fa3" in text and "86%" in text
    soft = next(line for line in lines if line.startswith("| soft-cap"))
    assert " 0 " not in soft and "0.00" not in soft


def test_render_all_includes_ceilings_and_suites():
    data = {
        "meta": {"torch": "x"},
        "ceilings": {"copy_tbps": 4.27, "matmul_tflops": 679.0},
        "suites": {"prefill": _fake_rows()},
    }
    text = report.render_all(data)
    assert "4.27 TB/s" in text and "679 TFLOP/s" in text and "## prefill" in text


def test_lower_is_better_ratio():
    row = {
        "case": "jit",
        "unit": "s",
        "higher_is_better": False,
        "systems": {
            "attnc": Outcome("ok", value=2.0).to_dict(),
            "flex": Outcome("ok", value=4.0).to_dict(),
        },
    }
    assert report.ratio_cells(row, {}) == ("2.00x flex", "")


def test_exceptions_map_to_statuses():
    assert from_exception(Unsupported("x")).status == "n/a"
    assert from_exception(Missing("no module")).status == "missing"
    out = from_exception(RuntimeError("boom\nmore"))
    assert (out.status, out.note) == ("error", "RuntimeError: boom")


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


def test_fast_rows_are_a_prefix_of_the_full_rows():
    for cases in (workloads.prefill_cases, workloads.decode_cases):
        fast, full = cases(full=False), cases()
        assert 4 <= len(fast) < len(full) and full[: len(fast)] == fast
    assert {c.name for c in workloads.prefill_cases(full=False)} >= {
        "causal, L=8192",
        "soft-cap 30, L=8192",
        "ALiBi, L=8192",
        "sliding window 1024, L=8192",
        "sigmoid, L=8192",
        "prefix-LM 1024, L=8192",
    }


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


def test_every_module_imports_without_gpu_or_triton():
    import importlib
    import pkgutil

    import benchmarks

    for info in pkgutil.iter_modules(benchmarks.__path__):
        if info.name != "__main__":
            importlib.import_module(f"benchmarks.{info.name}")


def test_rotation_count_exceeds_flush_size():
    from benchmarks.timing import rotation_count

    assert rotation_count(1 << 30) == 1
    assert rotation_count(96 << 20) == 3
    assert rotation_count(1 << 20) == 4


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


def _reference_attention(q, k, v, variant, params):
    """Dense float64 attention from the variant definitions (bottom-right alignment)."""
    import math

    import torch

    q_len, kv_len, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(q_len)[:, None] + kv_len - q_len
    kv_idx = torch.arange(kv_len)[None, :]
    if variant.stdlib == "softcap":
        s = params["cap"] * torch.tanh(s / params["cap"])
    if variant.stdlib == "alibi":
        s = s + params["slopes"].double()[:, None, None] * (kv_idx - q_pos)
    keep = kv_idx <= q_pos
    if variant.stdlib == "sliding_window":
        keep = keep & (q_pos - kv_idx < params["window"])
    if variant.stdlib == "prefix_lm":
        keep = keep | (kv_idx < params["prefix_len"])
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("key", ["causal", "softcap", "alibi", "sliding_window", "prefix_lm"])
@pytest.mark.parametrize("shape", [(40, 40), (24, 70)])
def test_flex_mods_match_variant_definitions(key, shape):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from benchmarks.flex_anchor import block_mask, score_mod
    from benchmarks.inputs import alibi_slopes
    from benchmarks.workloads import VARIANTS, Mask

    small = {"window": 9, "prefix_len": 5}
    spec = VARIANTS[key]
    mask = Mask(spec.mask.kind, window=9, prefix=5)
    params = {k: small.get(k, v) for k, v in spec.scalar_params.items()}
    if key == "alibi":
        params["slopes"] = alibi_slopes(4, device="cpu")
    q_len, kv_len = shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(q_len, 4, 16, generator=gen)
    k, v = (torch.randn(kv_len, 2, 16, generator=gen) for _ in range(2))
    smod = score_mod(spec.stdlib, params, kv_len - q_len)
    bm = block_mask(mask, q_len, kv_len, device="cpu")
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = flex_attention(q4, k4, v4, score_mod=smod, block_mask=bm, enable_gqa=True)
    ref = _reference_attention(q, k, v, spec, params)
    torch.testing.assert_close(out[0].transpose(0, 1).double(), ref, atol=1e-4, rtol=1e-4)


def test_flashinfer_keywords_per_variant():
    from benchmarks.flashinfer_anchor import variant_kwargs
    from benchmarks.workloads import VARIANTS

    assert variant_kwargs(VARIANTS["softcap"])["logits_soft_cap"] == 30.0
    assert variant_kwargs(VARIANTS["sliding_window"])["window_left"] == 1023
    assert variant_kwargs(VARIANTS["alibi"])["pos_encoding_mode"] == "ALIBI"
    for key, backend in (("alibi", "fa3"), ("sigmoid", "fa2"), ("prefix_lm", "fa2")):
        with pytest.raises(Unsupported):
            variant_kwargs(VARIANTS[key], backend)


def test_page_table_and_dense_gather():
    import torch

    from benchmarks.inputs import dense_kv, page_table

    lens = [37, 16, 1]
    indptr, indices, last, pages = page_table(lens, 16, seed=3)
    assert indptr.tolist() == [0, 3, 4, 5] and pages == 5
    assert sorted(indices.tolist()) == list(range(5)) and last.tolist() == [5, 16, 1]
    equal = [40, 40]
    indptr, indices, last, pages = page_table(equal, 16, seed=4)
    cache = torch.randn(pages, 2, 16, 2, 8)
    k, v = dense_kv(cache, indices, 2, 40)
    assert k.shape == (2, 2, 40, 8)
    for b in range(2):
        for t in (0, 17, 39):
            page = int(indices[indptr[b] + t // 16])
            torch.testing.assert_close(k[b, :, t], cache[page, 0, t % 16])
            torch.testing.assert_close(v[b, :, t], cache[page, 1, t % 16])


def test_results_write_json_and_markdown(tmp_path):
    import json

    from benchmarks.plot import write_plot
    from benchmarks.results import Results

    res = Results(str(tmp_path), {"torch": "x"})
    res.add_row("decode", "plain", "TB/s", {"attnc": Outcome("missing", note="not implemented")})
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["suites"]["decode"][0]["systems"]["attnc"]["status"] == "missing"
    assert "missing: not implemented" in (tmp_path / "bench.md").read_text()
    note = write_plot("decode", data["suites"]["decode"], str(tmp_path / "p.png"))
    assert "plot" in note


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


def test_full_decode_rows_include_page_size_one():
    rows = workloads.decode_cases(full=True)
    ones = [r for r in rows if r.page_size == 1]
    assert len(ones) == 1 and ones[0].name.endswith(", page 1")
    assert len({r.name for r in rows}) == len(rows)  # every row has its own label


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
    from benchmarks.cli import parse_args

    """A --skip entry that names no system (or two) stops the run before anything is timed,
    instead of timing every system; control characters are shown escaped."""
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
