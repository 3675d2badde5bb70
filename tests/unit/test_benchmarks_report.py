"""The benchmark report: statuses, ratios, JSON and Markdown results (no GPU)."""

from __future__ import annotations

from benchmarks import report
from benchmarks.outcome import Missing, Outcome, Unsupported, from_exception


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
