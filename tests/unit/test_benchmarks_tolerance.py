"""The cross-check's tolerance: above the errors recorded between agreeing systems, below
the error of a problem off by one key (CPU only, eager references)."""

from __future__ import annotations

import glob
import json
import os

import pytest
from fixed_system import FixedSystem as _Fixed

from benchmarks import measure

RESULTS = os.path.join(os.path.dirname(measure.__file__), "results")


def _recorded_errors() -> list[float]:
    """The relative errors of every ok outcome in the stored results."""
    errors = []
    for path in glob.glob(os.path.join(RESULTS, "*.json")):
        with open(path) as f:
            suites = json.load(f).get("suites")
        for rows in suites.values() if isinstance(suites, dict) else ():
            for row in rows:
                for out in row["systems"].values():
                    if out.get("status") == "ok" and out.get("rel_err") is not None:
                        errors.append(out["rel_err"])
    return errors


def test_tolerance_keeps_a_threefold_margin_over_the_recorded_errors():
    errors = _recorded_errors()
    if not errors:
        pytest.skip("no stored results")
    assert 3 * max(errors) <= measure.REL_TOL


def _inputs(length: int, heads: tuple = (2, 1), head_dim: int = 64, q_scale: float = 1.0):
    """Seeded randn q, k, v as the suite makes them (bf16), q scaled by ``q_scale``."""
    import torch

    gen = torch.Generator().manual_seed(0)
    hq, hkv = heads
    q = torch.randn(length, hq, head_dim, generator=gen) * q_scale
    k, v = (torch.randn(length, hkv, head_dim, generator=gen) for _ in range(2))
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def _checked(monkeypatch, right, wrong) -> str:
    """attnc's status when it gives ``wrong`` and the row's anchor ``right``."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (1.0, ""))
    systems = [_Fixed("flex", right), _Fixed("attnc", wrong, is_attnc=True)]
    out = measure.measure_case(None, systems, [None], 1e12, log=lambda _: None)
    assert out["flex"].status == "ok"
    return out["attnc"].status


def _variant_or_skip(stdlib: str):
    from benchmarks.attnc_systems import load_variant

    try:
        return load_variant(stdlib)
    except Exception as exc:  # the runtime may not import on this machine
        pytest.skip(f"attnc.load unavailable: {exc}")


@pytest.mark.parametrize("keys", [1023, 1025])
def test_a_window_of_1024_off_by_one_is_a_mismatch_on_the_suites_inputs(monkeypatch, keys):
    """The suite's window (1024) on its kind of inputs: one key more or less moves the output
    by 1.5e-2 to 2e-2 at this length, within a 2e-2 tolerance."""
    window = _variant_or_skip("sliding_window")
    q, k, v = _inputs(3072)
    right = window.reference(q, k, v, window=1024)
    wrong = window.reference(q, k, v, window=keys)
    assert _checked(monkeypatch, right, right) == "ok"
    assert _checked(monkeypatch, right, wrong) == "mismatch"


def test_a_short_window_off_by_one_is_a_mismatch(monkeypatch):
    window = _variant_or_skip("sliding_window")
    q, k, v = _inputs(256)
    right = window.reference(q, k, v, window=16)
    assert _checked(monkeypatch, right, window.reference(q, k, v, window=17)) == "mismatch"


def test_a_missing_soft_cap_is_a_mismatch_where_the_cap_bends_the_scores(monkeypatch):
    """With scores of standard deviation 4 the cap of 30 moves the output by about 7e-2. (On
    the suite's inputs, scores of deviation 1, it moves it by about 5e-3: below any tolerance
    that leaves room for two bf16 kernels' disagreement, about 3e-3.)"""
    softcap = _variant_or_skip("softcap")
    causal = _variant_or_skip("causal")
    q, k, v = _inputs(256, q_scale=4.0)
    right = softcap.reference(q, k, v, cap=30.0)
    assert _checked(monkeypatch, right, causal.reference(q, k, v)) == "mismatch"
