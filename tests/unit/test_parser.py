"""Every construct of the language parses to the expected AST, with real locations."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnc.dsl import ast
from attnc.dsl.errors import Loc
from attnc.dsl.parser import parse_expr, parse_module
from attnc.dsl.printer import format_expr, format_module

N = ast.Name


def num(value: float | int) -> ast.Num:
    return ast.Num(value, isinstance(value, float))


def b(op: str, left: ast.Expr, right: ast.Expr) -> ast.Binary:
    return ast.Binary(op, left, right)


def one_variant(body: str) -> tuple[ast.VariantItem, ...]:
    module = parse_module(f"variant v {{\n{body}\n}}\n")
    (variant,) = module.items
    assert isinstance(variant, ast.Variant)
    return variant.items


SOFTCAP = """\
# softcap.attn
variant softcap {
    doc "Gemma-2 / Grok logit soft-capping, causal";
    param cap: f32 = 50.0;
    score = cap * tanh(score / cap);
    mask  = kv_idx <= q_pos;
}
"""


def test_softcap_module() -> None:
    module = parse_module(SOFTCAP, "softcap.attn")
    assert module == ast.Module(
        "softcap.attn",
        (
            ast.Variant(
                "softcap",
                (
                    ast.Doc("Gemma-2 / Grok logit soft-capping, causal"),
                    ast.Param("cap", ast.ScalarType("f32"), num(50.0)),
                    ast.Assign(
                        "score",
                        b("*", N("cap"), ast.Call("tanh", (b("/", N("score"), N("cap")),))),
                    ),
                    ast.Assign("mask", b("<=", N("kv_idx"), N("q_pos"))),
                ),
            ),
        ),
    )


def test_top_level_items() -> None:
    module = parse_module(
        'import "lib/causal.attn";\ndef causal() = kv_idx <= q_pos;\n'
        "def both(a, b) = a && b;\nvariant x {}\n"
    )
    assert module.items == (
        ast.Import("lib/causal.attn"),
        ast.Def("causal", (), b("<=", N("kv_idx"), N("q_pos"))),
        ast.Def("both", ("a", "b"), b("&&", N("a"), N("b"))),
        ast.Variant("x", ()),
    )


def test_empty_module_and_comments_only() -> None:
    assert parse_module("").items == ()
    assert parse_module("# nothing here\n   # and here").items == ()


def test_params() -> None:
    items = one_variant(
        "param a: f32;\nparam w: i32 = 128;\nparam on: bool = true;\n"
        "param slopes: tensor<f32>[num_qo_heads];\nparam t: tensor<i32>[4, head_dim];"
    )
    assert items == (
        ast.Param("a", ast.ScalarType("f32"), None),
        ast.Param("w", ast.ScalarType("i32"), num(128)),
        ast.Param("on", ast.ScalarType("bool"), ast.BoolLit(True)),
        ast.Param("slopes", ast.TensorType("f32", (N("num_qo_heads"),)), None),
        ast.Param("t", ast.TensorType("i32", (num(4), N("head_dim"))), None),
    )


def test_let_assign_normalize_layout_doc() -> None:
    items = one_variant(
        'doc "say \\"hi\\" \\\\ bye";\nlet x = 1;\nscore = x;\nfoo = 2;\n'
        "normalize = none;\nkv_layout = paged | ragged | dense;\nkv_layout = paged;"
    )
    assert items == (
        ast.Doc('say "hi" \\ bye'),
        ast.Let("x", num(1)),
        ast.Assign("score", N("x")),
        ast.Assign("foo", num(2)),
        ast.Normalize("none"),
        ast.KvLayout(("paged", "ragged", "dense")),
        ast.KvLayout(("paged",)),
    )


def test_item_keywords_are_plain_names_inside_other_words() -> None:
    items = one_variant("let normalized = kv_layouts + docs + params;")
    assert items == (
        ast.Let("normalized", b("+", b("+", N("kv_layouts"), N("docs")), N("params"))),
    )


@pytest.mark.parametrize(
    ("text", "value", "is_float"),
    [
        ("42", 42, False),
        ("0", 0, False),
        ("007", 7, False),
        ("2147483647", 2147483647, False),
        ("1.0", 1.0, True),
        (".5", 0.5, True),
        ("1e-3", 1e-3, True),
        ("2.5E+2", 250.0, True),
        ("3.", 3.0, True),
    ],
)
def test_numbers(text: str, value: float, is_float: bool) -> None:
    expr = parse_expr(text)
    assert expr == ast.Num(value, is_float)
    assert type(expr.value) is (float if is_float else int)  # type: ignore[union-attr]


def test_atoms_calls_and_index() -> None:
    assert parse_expr("true") == ast.BoolLit(True)
    assert parse_expr("false") == ast.BoolLit(False)
    assert parse_expr("f()") == ast.Call("f", ())
    assert parse_expr("clamp(x, 0, 1.0)") == ast.Call("clamp", (N("x"), num(0), num(1.0)))
    assert parse_expr("t[qo_head, kv_idx + 1]") == ast.Index(
        "t", (N("qo_head"), b("+", N("kv_idx"), num(1)))
    )
    assert parse_expr("((x))") == N("x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a + b * c", b("+", N("a"), b("*", N("b"), N("c")))),
        ("a * b + c", b("+", b("*", N("a"), N("b")), N("c"))),
        ("a - b - c", b("-", b("-", N("a"), N("b")), N("c"))),
        ("a / b % c", b("%", b("/", N("a"), N("b")), N("c"))),
        ("(a + b) * c", b("*", b("+", N("a"), N("b")), N("c"))),
        ("a < b == c >= d", b("==", b("<", N("a"), N("b")), b(">=", N("c"), N("d")))),
        ("a || b && c", b("||", N("a"), b("&&", N("b"), N("c")))),
        ("a && b || c", b("||", b("&&", N("a"), N("b")), N("c"))),
        ("a == b && c != d", b("&&", b("==", N("a"), N("b")), b("!=", N("c"), N("d")))),
        ("a + 1 < b * 2", b("<", b("+", N("a"), num(1)), b("*", N("b"), num(2)))),
        ("-a * b", b("*", ast.Unary("-", N("a")), N("b"))),
        ("!a && b", b("&&", ast.Unary("!", N("a")), N("b"))),
        ("- -a", ast.Unary("-", ast.Unary("-", N("a")))),
        ("+a", ast.Unary("+", N("a"))),
        ("-f(x)", ast.Unary("-", ast.Call("f", (N("x"),)))),
        ("a ? b : c", ast.Ternary(N("a"), N("b"), N("c"))),
        (
            "a ? b : c ? d : e",
            ast.Ternary(N("a"), N("b"), ast.Ternary(N("c"), N("d"), N("e"))),
        ),
        (
            "a ? b ? c : d : e",
            ast.Ternary(N("a"), ast.Ternary(N("b"), N("c"), N("d")), N("e")),
        ),
        ("a || b ? c : d", ast.Ternary(b("||", N("a"), N("b")), N("c"), N("d"))),
        ("x == 1 ? 2 : 3", ast.Ternary(b("==", N("x"), num(1)), num(2), num(3))),
    ],
)
def test_precedence(text: str, expected: ast.Expr) -> None:
    assert parse_expr(text) == expected


def test_expression_locations() -> None:
    expr = parse_expr("a +\n  tanh(b * 2)", "e.attn")
    assert isinstance(expr, ast.Binary)
    assert expr.loc == Loc("e.attn", 1, 1, 2, 14)
    assert expr.left.loc == Loc("e.attn", 1, 1, 1, 2)
    call = expr.right
    assert isinstance(call, ast.Call)
    assert call.loc == Loc("e.attn", 2, 3, 2, 14)
    assert call.args[0].loc == Loc("e.attn", 2, 8, 2, 13)


def test_item_locations() -> None:
    module = parse_module(SOFTCAP, "softcap.attn")
    variant = module.items[0]
    assert isinstance(variant, ast.Variant)
    assert variant.loc == Loc("softcap.attn", 2, 1, 7, 2)
    doc, param, score, mask = variant.items
    assert doc.loc == Loc("softcap.attn", 3, 5, 3, 53)
    assert param.loc == Loc("softcap.attn", 4, 5, 4, 27)
    assert isinstance(param, ast.Param)
    assert param.type.loc == Loc("softcap.attn", 4, 16, 4, 19)
    assert param.default is not None
    assert param.default.loc == Loc("softcap.attn", 4, 22, 4, 26)
    assert mask.loc == Loc("softcap.attn", 6, 5, 6, 29)
    assert module.loc == Loc("softcap.attn", 1, 1)


def test_def_param_locations() -> None:
    module = parse_module("def f(a,  bb) = a;", "d.attn")
    (d,) = module.items
    assert isinstance(d, ast.Def)
    assert d.param_locs == (Loc("d.attn", 1, 7, 1, 8), Loc("d.attn", 1, 11, 1, 13))


def test_crlf_line_endings() -> None:
    module = parse_module("variant v {\r\n    score = 1;\r\n}\r\n", "w.attn")
    variant = module.items[0]
    assert isinstance(variant, ast.Variant)
    assert variant.items[0].loc == Loc("w.attn", 2, 5, 2, 15)


@pytest.mark.parametrize(
    "text",
    [
        "a + b * c",
        "(a + b) * c",
        "a - (b - c)",
        "a - b - c",
        "-(a + b)",
        "!(a && b) || c",
        "(a ? b : c) ? d : e",
        "a ? b ? c : d : e ? f : g",
        "x[1, 2] * f(y, 3.5)",
        "- -1",
        "(a < b) < c",
        "a < (b < c)",
        "1e-05 + 0.5",
    ],
)
def test_printer_round_trip(text: str) -> None:
    expr = parse_expr(text)
    printed = format_expr(expr)
    assert parse_expr(printed) == expr
    assert format_expr(parse_expr(printed)) == printed


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("((a)) + (b * c)", "a + b * c"),
        ("(a - (b - c))", "a - (b - c)"),
        ("a ? (b ? c : d) : (e ? f : g)", "a ? b ? c : d : e ? f : g"),
        ("(a ? b : c) ? d : e", "(a ? b : c) ? d : e"),
        ("-(-(1))", "--1"),
        ("-(a*b)", "-(a * b)"),
    ],
)
def test_printer_minimal_parentheses(text: str, printed: str) -> None:
    assert format_expr(parse_expr(text)) == printed


def test_format_module_canonical_text() -> None:
    text = format_module(parse_module(SOFTCAP + 'import "a.attn"; def f(x) = x * 2;'))
    assert text == (
        "variant softcap {\n"
        '    doc "Gemma-2 / Grok logit soft-capping, causal";\n'
        "    param cap: f32 = 50.0;\n"
        "    score = cap * tanh(score / cap);\n"
        "    mask = kv_idx <= q_pos;\n"
        "}\n\n"
        'import "a.attn";\n\n'
        "def f(x) = x * 2;\n"
    )
    assert format_module(parse_module("")) == ""


STDLIB = sorted((Path(__file__).parents[2] / "attnc" / "stdlib_variants").glob("*.attn"))


@pytest.mark.parametrize("path", STDLIB, ids=[p.stem for p in STDLIB])
def test_stdlib_files_parse_and_round_trip(path: Path) -> None:
    module = parse_module(path.read_text(encoding="utf-8"), str(path))
    assert module.items
    printed = format_module(module)
    assert parse_module(printed, str(path)) == module


def test_grammar_is_conflict_free_in_strict_mode() -> None:
    pytest.importorskip("interegular")
    from attnc.dsl.parser import grammar_parser

    strict = grammar_parser(strict=True)  # raises on a shift/reduce conflict or a collision
    assert strict.options.strict is True and grammar_parser().options.strict is False
    for path in STDLIB:  # both parsers read the same trees
        text = path.read_text(encoding="utf-8")
        assert strict.parse(text, start="module") == grammar_parser().parse(text, start="module")
