"""Lowering: types and promotion, lets, score reassignment, defs, imports, Program lookup."""

from __future__ import annotations

import pytest

from attnc.compiler import ir
from attnc.compiler.lower import Program
from attnc.compiler.pipeline import lower, parse
from attnc.dsl.errors import AttnError

F, I, B = ir.F32, ir.I32, ir.BOOL  # noqa: E741
SCORE = ir.Builtin("score", F)
KV = ir.Builtin("kv_idx", I)
QPOS = ir.Builtin("q_pos", I)


def lowered(text: str, file: str = "x.attn") -> Program:
    return lower(parse(text, file))


def score_of(body: str) -> ir.Expr | None:
    return lowered("variant v {\n" + body + "\n}\n").variant().score


def test_i32_plus_f32_promotes_with_cast() -> None:
    assert score_of("    score = score + kv_idx;") == ir.Binary("+", SCORE, ir.Cast(KV, F), F)


def test_int_literal_in_float_context_becomes_float_const() -> None:
    assert score_of("    score = score * 2;") == ir.Binary("*", SCORE, ir.Const(2.0, F), F)


def test_int_arithmetic_stays_i32_then_casts_once() -> None:
    assert score_of("    score = score + (kv_idx - q_pos) / 2;") == ir.Binary(
        "+", SCORE, ir.Cast(ir.Binary("/", ir.Binary("-", KV, QPOS, I), ir.Const(2, I), I), F), F
    )


def test_integer_score_is_cast_to_f32() -> None:
    assert score_of("    score = kv_idx;") == ir.Cast(KV, F)


def test_comparison_is_bool_and_promotes_operands() -> None:
    v = lowered("variant v {\n    param w: f32;\n    mask = kv_idx < w;\n}\n").variant()
    assert v.mask == ir.Binary("<", ir.Cast(KV, F), ir.ParamRef("w", F), B)


def test_call_types() -> None:
    # float functions cast integer arguments, same-type functions promote, int() truncates
    assert score_of("    score = tanh(kv_idx) + max(kv_idx, 3) + float(int(score));") == ir.Binary(
        "+",
        ir.Binary(
            "+",
            ir.Call("tanh", (ir.Cast(KV, F),), F),
            ir.Cast(ir.Call("max", (KV, ir.Const(3, I)), I), F),
            F,
        ),
        ir.Cast(ir.Cast(SCORE, I), F),
        F,
    )


def test_select_promotes_branches() -> None:
    assert score_of("    score = kv_idx < q_pos ? score : 0;") == ir.Select(
        ir.Binary("<", KV, QPOS, B), SCORE, ir.Const(0.0, F), F
    )


def test_params_and_tensor_loads() -> None:
    v = lowered(
        "variant v {\n    param t: tensor<i32>[num_qo_heads, 4];\n    param on: bool = true;\n"
        "    mask = on && t[qo_head, 1] > kv_idx;\n}\n"
    ).variant()
    load = ir.TensorLoad("t", (ir.Builtin("qo_head", I), ir.Const(1, I)), I)
    assert v.mask == ir.Binary("&&", ir.ParamRef("on", B), ir.Binary(">", load, KV, B), B)
    assert v.params == (
        ir.ParamDecl("t", "tensor", I, ("num_qo_heads", 4), None),
        ir.ParamDecl("on", "scalar", B, (), True),
    )
    assert [p.required for p in v.params] == [True, False]


def test_negative_defaults() -> None:
    v = lowered(
        "variant v {\n    param a: f32 = -1.5;\n    param b: i32 = -3;\n"
        "    score = score * a + b;\n}\n"
    ).variant()
    assert [(p.name, p.default) for p in v.params] == [("a", -1.5), ("b", -3)]
    assert isinstance(v.param("b").default, int)


def test_let_is_inlined_with_its_value() -> None:
    v = lowered(
        "variant v {\n    param n: i32 = 2;\n    let a = kv_idx + n;\n"
        "    score = score + a;\n    mask = a > q_pos;\n}\n"
    ).variant()
    a = ir.Binary("+", KV, ir.ParamRef("n", I), I)
    assert v.score == ir.Binary("+", SCORE, ir.Cast(a, F), F)
    assert v.mask == ir.Binary(">", a, QPOS, B)


def test_lets_are_local_to_their_variant() -> None:
    text = (
        "variant a {\n    let t = 2.0;\n    score = score * t;\n}\nvariant b {\n    score = t;\n}\n"
    )
    with pytest.raises(AttnError) as info:
        lowered(text)
    assert info.value.message == "unknown name 't'"
    assert str(info.value.loc) == "x.attn:6:13"


def test_let_sees_score_at_its_definition() -> None:
    v = lowered(
        "variant v {\n    let old = score;\n    score = score * 2.0;\n    score = score + old;\n}\n"
    ).variant()
    assert v.score == ir.Binary("+", ir.Binary("*", SCORE, ir.Const(2.0, F), F), SCORE, F)


def test_sequential_score_reassignment() -> None:
    v = lowered("variant v {\n    score = score + 1.0;\n    score = score * score;\n}\n").variant()
    inner = ir.Binary("+", SCORE, ir.Const(1.0, F), F)
    assert v.score == ir.Binary("*", inner, inner, F)


def test_let_after_reassignment_sees_new_score() -> None:
    v = lowered(
        "variant v {\n    score = score * 3.0;\n    let t = score;\n    score = t + t;\n}\n"
    ).variant()
    t = ir.Binary("*", SCORE, ir.Const(3.0, F), F)
    assert v.score == ir.Binary("+", t, t, F)


def test_def_inlined_with_arguments() -> None:
    v = lowered(
        "def sq(x) = x * x;\ndef between(x, lo, hi) = lo <= x && x < hi;\n"
        "variant v {\n    param w: i32;\n    score = sq(score) + sq(kv_idx);\n"
        "    mask = between(kv_idx, q_pos - w, q_pos + 1);\n}\n"
    ).variant()
    assert v.score == ir.Binary(
        "+", ir.Binary("*", SCORE, SCORE, F), ir.Cast(ir.Binary("*", KV, KV, I), F), F
    )
    w = ir.ParamRef("w", I)
    assert v.mask == ir.Binary(
        "&&",
        ir.Binary("<=", ir.Binary("-", QPOS, w, I), KV, B),
        ir.Binary("<", KV, ir.Binary("+", QPOS, ir.Const(1, I), I), B),
        B,
    )


def test_def_calling_def() -> None:
    v = lowered(
        "def c() = kv_idx <= q_pos;\ndef both(x) = c() && x;\n"
        "variant v {\n    mask = both(kv_idx > 0);\n}\n"
    ).variant()
    assert v.mask == ir.Binary(
        "&&", ir.Binary("<=", KV, QPOS, B), ir.Binary(">", KV, ir.Const(0, I), B), B
    )


def test_param_passed_to_def_counts_as_used() -> None:
    program = lowered(
        "def in_window(w) = q_pos - kv_idx < w;\n"
        "variant v {\n    param window: i32;\n    mask = in_window(window);\n}\n"
    )
    assert program.warnings == ()
    assert program.variant().mask == ir.Binary(
        "<", ir.Binary("-", QPOS, KV, I), ir.ParamRef("window", I), B
    )


def test_imported_defs(tmp_path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "m.attn").write_text(
        "def causal() = kv_idx <= q_pos;\ndef scaled(x, k) = x * k;\n", encoding="utf-8"
    )
    main = tmp_path / "main.attn"
    main.write_text(
        'import "lib/m.attn";\nvariant v {\n    score = scaled(score, 0.5);\n'
        "    mask = causal();\n}\n",
        encoding="utf-8",
    )
    program = lowered(main.read_text(), str(main))
    v = program.variant()
    assert v.score == ir.Binary("*", SCORE, ir.Const(0.5, F), F)
    assert v.mask == ir.Binary("<=", KV, QPOS, B)
    assert v.file == str(main)


def test_imported_variants_are_not_returned(tmp_path) -> None:
    (tmp_path / "other.attn").write_text("variant other {\n}\ndef one() = 1;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "other.attn";\nvariant mine {\n    score = score * one();\n}\n')
    program = lowered(main.read_text(), str(main))
    assert [v.name for v in program.variants] == ["mine"]


def test_diamond_import_loads_each_file_once(tmp_path) -> None:
    (tmp_path / "base.attn").write_text("def c() = kv_idx <= q_pos;\n")
    (tmp_path / "l.attn").write_text('import "base.attn";\ndef l() = c();\n')
    (tmp_path / "r.attn").write_text('import "base.attn";\ndef r() = c();\n')
    main = tmp_path / "main.attn"
    main.write_text('import "l.attn";\nimport "r.attn";\nvariant v {\n    mask = l() && r();\n}\n')
    v = lowered(main.read_text(), str(main)).variant()
    c = ir.Binary("<=", KV, QPOS, B)
    assert v.mask == ir.Binary("&&", c, c, B)


def test_stdlib_sliding_window_lowering() -> None:
    from attnc.compiler.pipeline import STDLIB_DIR

    path = f"{STDLIB_DIR}/sliding_window.attn"
    v = lowered(open(path, encoding="utf-8").read(), path).variant("sliding_window")
    assert v.mask == ir.Binary(
        "&&",
        ir.Binary("<=", KV, QPOS, B),
        ir.Binary("<", ir.Binary("-", QPOS, KV, I), ir.ParamRef("window", I), B),
        B,
    )
    assert v.score is None and v.output is None
    assert v.normalize == "softmax"
    assert v.kv_layouts == ("paged", "ragged", "dense")


def test_variant_fields() -> None:
    v = lowered(
        'variant v {\n    doc "hello";\n    normalize = none;\n    kv_layout = ragged | dense;\n'
        "    output = out * 2.0;\n}\n"
    ).variant()
    assert (v.name, v.doc, v.normalize, v.kv_layouts) == ("v", "hello", "none", ("ragged", "dense"))
    assert v.output == ir.Binary("*", ir.Builtin("out", F), ir.Const(2.0, F), F)
    assert v.score is None and v.mask is None


TWO = (
    "variant alpha {\n    score = score * 2.0;\n}\nvariant beta {\n    mask = kv_idx <= q_pos;\n}\n"
)


def test_program_variant_by_name() -> None:
    program = lowered(TWO)
    assert [v.name for v in program.variants] == ["alpha", "beta"]
    assert program.variant("beta").mask == ir.Binary("<=", KV, QPOS, B)
    assert program.variant("alpha").score == ir.Binary("*", SCORE, ir.Const(2.0, F), F)


def test_program_variant_errors() -> None:
    program = lowered(TWO)
    with pytest.raises(LookupError) as info:
        program.variant()
    assert str(info.value) == "the file defines several variants (alpha, beta): choose one"
    with pytest.raises(LookupError) as info:
        program.variant("alpah")
    assert str(info.value) == "no variant 'alpah' (did you mean 'alpha'?); variants: alpha, beta"


def test_program_single_variant_without_name() -> None:
    assert lowered("variant only {\n}\n").variant().name == "only"


def test_locations_are_recorded() -> None:
    v = lowered("variant v {\n    param c: f32;\n    score = c * score;\n}\n").variant()
    assert str(v.loc) == "x.attn:1:1"
    assert str(v.param("c").loc) == "x.attn:2:5"
    assert isinstance(v.score, ir.Binary)
    assert str(v.score.a.loc) == "x.attn:3:13"
    assert str(v.score.b.loc) == "x.attn:3:17"
