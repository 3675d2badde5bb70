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
    assert out["attnc"].status == "ok" and out["attnc"].note == "vs eager reference, row blocks"
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


MASKS = {"sliding_window": "window", "prefix_lm": "prefix", "sigmoid": "none"}


def _spec(key: str, params: dict):
    """The suite's variant ``key`` with its mask's width or prefix set from ``params``."""
    from benchmarks.workloads import Mask, VariantSpec

    width = params.get("window", 0), params.get("prefix_len", 0)
    mask = Mask(MASKS.get(key, "causal"), window=width[0], prefix=width[1])
    scalars = tuple((k, v) for k, v in params.items() if not hasattr(v, "shape"))
    return VariantSpec(key, key, mask, scalars)


def _dense_row(key: str, length: int, params: dict, heads: tuple = (4, 1), head_dim: int = 32):
    """A prefill case and one seeded CPU input set for it."""
    import torch

    from benchmarks.inputs import DenseData
    from benchmarks.workloads import PrefillCase

    hq, hkv = heads
    case = PrefillCase(_spec(key, params), length, length, hq, hkv, head_dim)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(length, hq, head_dim, generator=gen)
    k, v = (torch.randn(length, hkv, head_dim, generator=gen) for _ in range(2))
    return case, DenseData(q, k, v, params)


def _variant_or_skip(stdlib: str):
    from benchmarks.attnc_systems import load_variant

    try:
        return load_variant(stdlib)
    except Exception as exc:  # the runtime may not import on this machine
        pytest.skip(f"attnc.load unavailable: {exc}")


def test_attnc_self_check_sees_a_prefix_lm_row_computed_as_causal():
    """On prefix-LM the last rows see the same keys with or without the prefix; the check's
    rows spread over the sequence tell the two problems apart."""
    from benchmarks.attnc_systems import AttncPrefill

    causal = _variant_or_skip("causal")
    prefix_lm = _variant_or_skip("prefix_lm")
    case, data = _dense_row("prefix_lm", 2048, {"prefix_len": 1024})
    right = prefix_lm.reference(data.q, data.k, data.v, prefix_len=1024)
    wrong = causal.reference(data.q, data.k, data.v)
    assert AttncPrefill().self_check(case, data, right) < 1e-6
    assert AttncPrefill().self_check(case, data, wrong) > 0.1


@pytest.mark.parametrize(
    "key, params, length",
    [
        ("causal", {}, 300),
        ("sliding_window", {"window": 100}, 300),
        ("prefix_lm", {"prefix_len": 150}, 300),
        ("alibi", {}, 300),
        ("sigmoid", {"bias": 0.0}, 300),
    ],
)
def test_attnc_self_check_passes_the_right_output(key, params, length):
    """Every block the check computes gives its rows their own positions: the variant's
    whole reference output passes with no error."""
    from benchmarks.attnc_systems import AttncPrefill
    from benchmarks.inputs import alibi_slopes

    variant = _variant_or_skip(key)
    if key == "alibi":
        params = {"slopes": alibi_slopes(4, "cpu")}
    case, data = _dense_row(key, length, params)
    full = variant.reference(data.q, data.k, data.v, **params)
    assert AttncPrefill().self_check(case, data, full, rows=16) < 1e-6


def test_check_blocks_reach_the_first_rows_and_the_mask_boundaries():
    from benchmarks.attnc_systems import check_blocks, keys_seen
    from benchmarks.workloads import VARIANTS, PrefillCase

    prefix = PrefillCase(VARIANTS["prefix_lm"], 8192, 8192)
    blocks = check_blocks(prefix, rows=64)
    assert blocks[0] == (0, 64) and blocks[-1] == (8128, 8192) and (992, 1056) in blocks
    assert len(blocks) <= 9 and keys_seen(prefix, 64) == 1024 and keys_seen(prefix, 1056) == 1056
    window = PrefillCase(VARIANTS["sliding_window"], 2048, 4096)
    assert (0, 64) in check_blocks(window, rows=64)  # the window's cut is before q's first row
    assert keys_seen(window, 64) == 2112 and keys_seen(window, 2048) == 4096
    sigmoid = PrefillCase(VARIANTS["sigmoid"], 8192, 8192)
    assert check_blocks(sigmoid, rows=64) == [(8128, 8192)]
    free = check_blocks(sigmoid, rows=64, rows_free=True)
    assert len(free) == 8 and free[0] == (0, 64) and free[-1] == (8128, 8192)


def test_rotation_count_exceeds_flush_size():
    from benchmarks.timing import rotation_count

    assert rotation_count(1 << 30) == 1
    assert rotation_count(96 << 20) == 3
    assert rotation_count(1 << 20) == 4


def test_unmasked_self_check_reaches_rows_wrong_in_the_middle():
    """sigmoid reads no row position: its blocks spread over the sequence, each computed with
    every key. Rows 192-319 computed with another bias (bf16 outputs, L = 512) pass a check
    of the last rows only."""
    import torch

    from benchmarks.attnc_systems import AttncPrefill

    variant = _variant_or_skip("sigmoid")
    case, data = _dense_row("sigmoid", 512, {"bias": 0.0}, heads=(4, 2), head_dim=64)
    q, k, v = (t.bfloat16() for t in (data.q, data.k, data.v))
    data.q, data.k, data.v = q, k, v
    right = variant.reference(q, k, v, bias=0.0)
    wrong = right.clone()
    wrong[192:320] = variant.reference(q[192:320], k, v, bias=0.5)
    assert torch.equal(wrong[448:], right[448:])
    assert AttncPrefill().self_check(case, data, right) < 1e-6
    assert AttncPrefill().self_check(case, data, wrong) > 1e-2


REL_BIAS = """variant rel_bias {
    score = score + 0.01 * float(kv_idx - q_pos);
}"""


def test_unmasked_self_check_keeps_the_last_rows_when_rows_read_positions(monkeypatch):
    """Without a mask, a variant reading q_pos is checked on its last rows only: a block
    elsewhere, computed with every key, would give its rows the last positions."""
    from benchmarks import attnc_systems
    from benchmarks.attnc_systems import AttncPrefill, reads_row_position
    from benchmarks.workloads import Mask, PrefillCase, VariantSpec

    try:
        import attnc

        variant = attnc.load(source=REL_BIAS)
    except Exception as exc:  # the runtime may not import on this machine
        pytest.skip(f"attnc.load unavailable: {exc}")
    monkeypatch.setitem(attnc_systems._VARIANTS, "rel_bias", variant)
    assert reads_row_position(variant)
    assert not reads_row_position(_variant_or_skip("sigmoid"))
    assert reads_row_position(_variant_or_skip("causal"))
    _, data = _dense_row("sigmoid", 300, {})
    case = PrefillCase(VariantSpec("rel_bias", "rel_bias", Mask("none")), 300, 300, 4, 1, 32)
    full = variant.reference(data.q, data.k, data.v)
    assert AttncPrefill().self_check(case, data, full, rows=16) < 1e-6
