"""IR constants compare by their bits: ``-0.0`` and ``0.0`` differ (``1.0 / min(x, -0.0)`` is
``-inf`` where ``1.0 / min(x, 0.0)`` is ``inf``). With Python's float equality two variants
that differed only in a zero's sign had equal IR, so the memos keyed by IR (the analyses
memo, the module registry) handed the second one loaded the first one's code: its module
source held ``-0.0f`` where its own functor and reference held ``0.0``."""

from __future__ import annotations

import math

import pytest

import attnc
from attnc.codegen.cuda_expr import render_const
from attnc.compiler import ir
from attnc.compiler.analysed import analysed
from attnc.compiler.ir_printer import format_ir
from attnc.runtime.build import modules

F = ir.F32
SOURCE = "variant negzero_probe { param x: f32 = %s; score = score * sigmoid(1.0 / min(x, %s)); }"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _lines(text: str, call: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if call in line]


def test_constants_compare_by_type_and_bits() -> None:
    assert ir.Const(-0.0, F) != ir.Const(0.0, F)
    assert len({ir.Const(-0.0, F), ir.Const(0.0, F)}) == 2
    assert ir.Binary("+", ir.Const(-0.0, F), ir.Const(1.0, F), F) != ir.Binary(
        "+", ir.Const(0.0, F), ir.Const(1.0, F), F
    )
    assert ir.Const(1, F) == ir.Const(1.0, F)  # the same f32 value, as every emitter writes it
    assert ir.Const(1, ir.I32) != ir.Const(True, ir.BOOL)
    assert ir.Const(0, ir.I32) != ir.Const(False, ir.BOOL)
    # Every NaN is one value: equal and of one hash, so a memo finds it again.
    nans = [ir.Const(math.nan, F), ir.Const(-math.nan, F), ir.Const(float("nan"), F)]
    assert all(n == nans[0] and hash(n) == hash(nans[0]) for n in nans)
    assert ir.Const(math.inf, F) != ir.Const(-math.inf, F)


def test_param_defaults_compare_by_bits() -> None:
    neg = ir.ParamDecl("x", "scalar", F, (), -0.0)
    assert neg != ir.ParamDecl("x", "scalar", F, (), 0.0)
    assert neg == ir.ParamDecl("x", "scalar", F, (), -0.0)
    assert hash(neg) == hash(ir.ParamDecl("x", "scalar", F, (), -0.0))
    assert ir.ParamDecl("x", "scalar", ir.I32, (), 1) != ir.ParamDecl("x", "scalar", F, (), 1.0)


@pytest.mark.parametrize("order", [("-0.0", "0.0"), ("0.0", "-0.0")])
def test_variants_differing_in_a_zero_sign_keep_their_own_code(cache_dir, order) -> None:
    variants = {z: attnc.load(source=SOURCE % (z, z)) for z in order}
    for z, v in variants.items():
        zero = ir.Const(float(z), F)
        own = _lines(v.cuda_source, "attnc::vm::min_(")
        assert own == [
            f"c0 = attnc::vm::sigmoid_((1.0f / attnc::vm::min_(p.p_x, {render_const(zero)})));"
        ]
        for registry in (
            modules.DECODE_MODULES,
            modules.PREFILL_MODULES,
            modules.PREFILL_SM90_MODULES,
        ):
            spec = registry.spec(v.ir, "bfloat16", 128, "90a")
            assert _lines(spec.source, "attnc::vm::min_(") == own
        assert f"_min(env['x'], _f32(env, {z}))" in v.reference_source
        remembered = analysed(v.ir).variant  # the analyses memo's optimised IR
        assert format_ir(remembered.score) == format_ir(v.ir.score)
        assert math.copysign(1.0, remembered.params[0].default) == math.copysign(1.0, float(z))
    first, second = (variants[z] for z in order)
    assert first.ir != second.ir
    keys = {(v.ir, "bfloat16", 128, "90a") for v in variants.values()}  # the registry's key
    assert len(keys) == 2


def test_a_negative_zero_is_written_in_parentheses() -> None:
    """``-0.0f`` was written bare (``-0.0 < 0`` is false): a minus before it read '--'."""
    assert render_const(ir.Const(-0.0, F)) == "(-0.0f)"
    assert render_const(ir.Const(0.0, F)) == "0.0f"
    assert render_const(ir.Const(-1.5, F)) == "(-1.5f)"
