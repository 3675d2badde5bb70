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


def _sigmoid_row(stand_in: dict) -> dict:
    """A sigmoid row: attnc, a compared anchor and FA4 timed as a full softmax stand-in."""
    return {
        "case": "sigmoid, L=8192",
        "unit": "TFLOP/s",
        "higher_is_better": True,
        "systems": {
            "attnc": Outcome("ok", value=550.0).to_dict(),
            "flex": Outcome("ok", value=275.0).to_dict(),
            "fa4": stand_in,
        },
    }


def test_a_stand_in_is_no_anchor_to_compare_with():
    """An anchor that ran another function (a stand-in) is shown but never the best anchor."""
    note = "full softmax stand-in, not compared"
    fa4 = Outcome("ok", value=660.0, note=note, stand_in=True).to_dict()
    row = _sigmoid_row(fa4)
    assert fa4["stand_in"] is True
    assert report.best_anchor(row) == ("flex", 275.0)
    assert report.ratio_cells(row, {}) == ("2.00x flex", "")
    assert "660" in report.render_suite("prefill", [row], {})
    del row["systems"]["flex"]
    assert report.best_anchor(row) is None and report.ratio_cells(row, {}) == ("", "")


def test_results_written_before_the_stand_in_field_read_its_note():
    """Without ``stand_in`` an outcome is a stand-in when its note says "not compared"."""
    old = {"status": "ok", "value": 660.0, "note": "full softmax stand-in, not compared"}
    assert report.is_stand_in(old)
    assert report.best_anchor(_sigmoid_row(old)) == ("flex", 275.0)
    plain = {"status": "ok", "value": 660.0, "note": "median of 2 rounds"}
    assert not report.is_stand_in(plain)
    assert report.best_anchor(_sigmoid_row(plain)) == ("fa4", 660.0)
