"""The host harness checks a functor's bias step: score_bias stepped from a key by k (as the
Hopper kernel steps it) equals score_bias at the key + k for ALiBi and a hand-made variant,
and a wrong step is caught."""

from __future__ import annotations

import pytest
from host_fixture import HARNESS_MARKS

import attnc.testing.host_test as host_test
from attnc.codegen.functor import emit_functor
from attnc.codegen.module import analysed
from attnc.compiler.pipeline import compile_source, resolve_source
from attnc.testing.host_test import run_host_test

pytestmark = HARNESS_MARKS

POINTS = 1200
# Stepped well below the harness' tolerance: an f32 fma against a direct f32 evaluation.
STEP_BOUND = 1e-6

# A scaled score, kv_idx subtracted from a shifted position and a second offset on q_idx:
# the step is -slopes[qo_head] - 0.25.
STEPPED = """
variant stepped {
    param slopes: tensor<f32>[num_qo_heads];
    param gain: f32 = 0.5;
    score = score * gain + slopes[qo_head] * float(q_pos - kv_idx + 3)
        - 0.25 * float(kv_idx - q_idx);
    mask = kv_idx <= q_pos + 8;
}
"""


def compiled_of(text: str, file: str = "<string>"):
    compiled, _ = compile_source(text, file)
    assert len(compiled) == 1
    return compiled[0]


VARIANTS = {
    "alibi": lambda: compiled_of(*resolve_source("stdlib:alibi")),
    "stepped": lambda: compiled_of(STEPPED),
}
STEP_BODIES = {
    "alibi": ("    return row.h0;\n  }", "    return (1.001f * row.h0);\n  }"),
    "stepped": ("return ((-row.h0) + (-0.25f));", "return ((-row.h0) + (0.25f));"),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_stepped_bias_matches_the_shifted_key(name: str) -> None:
    c = VARIANTS[name]()
    source = emit_functor(analysed(c.variant))
    assert "static constexpr bool kBiasStep = true;" in source
    assert STEP_BODIES[name][0] in source
    report = run_host_test(c, points=POINTS, seed=3)
    assert report.ok, report.summary()
    assert report.points == POINTS
    assert 0.0 < report.bias_step_error <= STEP_BOUND, report.summary()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_wrong_step_is_caught(monkeypatch, name: str) -> None:
    real = host_test.emit_functor
    original, broken = STEP_BODIES[name]

    def corrupt(c):
        source = real(c)
        assert source.count(original) == 1
        return source.replace(original, broken)

    monkeypatch.setattr(host_test, "emit_functor", corrupt)
    report = run_host_test(VARIANTS[name](), points=POINTS, seed=3)
    assert not report.ok
    assert report.bias_step_error > host_test.TOLERANCE
    # only the step is wrong: the affine form itself still matches the reference
    assert report.affine_error <= host_test.TOLERANCE and report.score_error <= 1e-5


def test_variants_without_a_step_print_no_bias_lines() -> None:
    c = compiled_of(*resolve_source("stdlib:softcap"))
    source = emit_functor(analysed(c.variant))
    assert "static constexpr bool kBiasStep = false;" in source
    assert "score_bias_step(const Row& row) const {\n    return 0.0f;" in source
    report = run_host_test(c, points=300)
    assert report.ok, report.summary()
    assert report.bias_step_error == 0.0
