"""Which softmax reference a Hopper launch takes (attnc/fixed_reference.cuh), on the CPU with
the generated functors: soft-cap's bound is |cap| log2(e); bf16 P takes it as a fixed
reference up to 50 (|cap| <= 34.65), and NaN, infinite or larger bounds, fp16 P and variants
without a bound keep the online reference (-inf)."""

from __future__ import annotations

import math
import subprocess

import pytest
from host_fixture import NVCC_MARKS, build_host_fixture

from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source, resolve_source

pytestmark = NVCC_MARKS

LOG2E = 1 / math.log(2.0)
CAPS = [30.0, -30.0, 1.0, 0.0, 34.6, 34.65, 34.66, 34.7, 50.0, math.inf, math.nan, 1e-30]


@pytest.fixture(scope="module")
def choices(tmp_path_factory) -> tuple[list[list[float]], float]:
    out = tmp_path_factory.mktemp("fixed_reference")
    for name in ("softcap", "causal"):
        compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
        (out / f"functor_{name}.cuh").write_text(emit_functor(compiled[0]))
    binary = build_host_fixture("fixed_reference_host.cu", out / "choice", include=(out,))
    text = "\n".join(repr(c) for c in CAPS) + "\n"
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    *rows, causal = run.stdout.splitlines()
    assert len(rows) == len(CAPS)
    assert causal.startswith("causal ")
    return [[float(x) for x in row.split()] for row in rows], float(causal.split()[1])


@pytest.mark.parametrize("i", range(len(CAPS)))
def test_softcap_takes_the_fixed_reference_only_within_the_limit(choices, i):
    rows, _ = choices
    cap = CAPS[i]
    bound, bf16, fp16 = rows[i]
    if math.isnan(cap):
        assert math.isnan(bound)
    else:
        assert bound == pytest.approx(abs(cap) * LOG2E, rel=1e-6)
    within = not math.isnan(cap) and abs(cap) * LOG2E <= 50.0 * (1 - 1e-6)
    beyond = math.isnan(cap) or abs(cap) * LOG2E > 50.0 * (1 + 1e-6)
    if within:
        assert bf16 == bound
    if beyond:
        assert bf16 == -math.inf
    assert fp16 == -math.inf


def test_a_variant_without_a_bound_keeps_the_online_reference(choices):
    _, causal = choices
    assert causal == -math.inf
