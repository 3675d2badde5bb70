"""The functor's logit bound (kLogitBound, logit_bound_log2) on the host harness: every
random point's log2 logit lies within the bound the functor reports for its params, for the
bounded forms the analysis accepts; and the harness's check does catch a bound that is too
small."""

from __future__ import annotations

import shutil

import pytest

import attnc.codegen.functor as functor
import attnc.testing.host_test as host_test
from attnc.compiler import ir
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(
        shutil.which("nvcc") is None
        and host_test._cuda_home_nvcc() is None
        and shutil.which("g++") is None,
        reason="needs nvcc or g++",
    ),
]

SOURCES = {
    "softcap": "param cap: f32 = 30.0; score = cap * tanh(score / cap); mask = kv_idx <= q_pos;",
    "scaled_sigmoid": "param w: f32 = 3.0; score = w * sigmoid(score) - 2.0;",
    "clamped": "param c: f32 = 5.0; score = clamp(score * 0.5, -c, c);",
    "selected": "score = kv_idx % 3 == 0 ? 4.0 * tanh(score) : -tanh(score / 2.0);",
}


def compiled(body: str):
    found, _ = compile_source(f"variant v {{ {body} }}", "b.attn")
    return found[0]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_bounded_scores_stay_within_their_bound(name):
    c = compiled(SOURCES[name])
    assert "static constexpr bool kLogitBound = true;" in functor.emit_functor(c)
    report = run_host_test(c, points=800)
    assert report.ok, report.summary()
    assert report.bound_violations == 0 and report.points > 0


def test_the_harness_catches_a_bound_that_is_too_small(monkeypatch):
    monkeypatch.setattr(functor, "logit_bound", lambda e: ir.Const(1e-3, ir.F32))
    report = run_host_test(compiled(SOURCES["softcap"]), points=400)
    assert report.bound_violations > 0 and not report.ok, report.summary()
    assert "logit bound violations" in report.summary()
