"""Syntax errors: exact messages, locations and rendered output with the caret line."""

from __future__ import annotations

import pytest

from attnc.dsl.errors import EXCERPT_CONTEXT, AttnError, Loc, display_width
from attnc.dsl.parser import parse_expr, parse_module

C = EXCERPT_CONTEXT


def error_of(text: str, file: str = "bad.attn") -> AttnError:
    with pytest.raises(AttnError) as info:
        parse_module(text, file)
    return info.value


# (source, exact rendered diagnostic)
RENDERED = [
    (
        "missing semicolon",
        "variant v {\n    let a = 1\n    score = a;\n}\n",
        "bad.attn:2:14: error: expected ';' after the expression, found 'score'\n"
        "        let a = 1\n"
        "                 ^",
    ),
    (
        "missing semicolon before brace",
        "variant v { score = score * 2 }",
        "bad.attn:1:31: error: expected ';' after the expression, found '}'\n"
        "    variant v { score = score * 2 }\n"
        "                                  ^",
    ),
    (
        "missing closing brace",
        "variant causal {\n    mask = kv_idx <= q_pos;\n",
        "bad.attn:2:28: error: expected '}' to close variant 'causal'\n"
        "        mask = kv_idx <= q_pos;\n"
        "                               ^",
    ),
    (
        "bad token",
        "variant v {\n    score = score * * 2;\n}\n",
        "bad.attn:2:21: error: expected an expression, found '*'\n"
        "        score = score * * 2;\n"
        "                        ^",
    ),
    (
        "unterminated string",
        'variant v {\n    doc "soft cap;\n}\n',
        'bad.attn:2:9: error: unterminated string\n        doc "soft cap;\n            ^~~~~~~~~~',
    ),
    (
        "stray character",
        "variant v {\n    score = score $ 2;\n}\n",
        "bad.attn:2:19: error: unexpected character '$'\n"
        "        score = score $ 2;\n"
        "                      ^",
    ),
    (
        "missing expression",
        "variant v {\n    mask = ;\n}\n",
        "bad.attn:2:12: error: expected an expression, found ';'\n"
        "        mask = ;\n"
        "               ^",
    ),
    (
        "bad param type",
        "variant v {\n    param cap: float = 1.0;\n}\n",
        "bad.attn:2:16: error: expected a type (f32, i32, bool or tensor<...>), found 'float'\n"
        "        param cap: float = 1.0;\n"
        "                   ^~~~~",
    ),
    (
        "keyword used as a name",
        "variant v {\n    let param = 1;\n}\n",
        "bad.attn:2:9: error: 'param' is a keyword and cannot be used as a name\n"
        "        let param = 1;\n"
        "            ^~~~~",
    ),
    (
        "keyword as variant name",
        "variant let { }",
        "bad.attn:1:9: error: 'let' is a keyword and cannot be used as a name\n"
        "    variant let { }\n"
        "            ^~~",
    ),
    (
        "integer too large",
        "variant v { param w: i32 = 4294967296; }",
        "bad.attn:1:28: error: integer literal '4294967296' is too large for i32 "
        "(at most 2147483647)\n"
        "    variant v { param w: i32 = 4294967296; }\n"
        "                               ^~~~~~~~~~",
    ),
    (
        "unknown escape",
        'variant v { doc "a\\tb"; }',
        "bad.attn:1:19: error: unknown escape '\\t' in string (only \\\" and \\\\)\n"
        '    variant v { doc "a\\tb"; }\n'
        "                      ^~",
    ),
]


@pytest.mark.parametrize(
    ("source", "rendered"), [c[1:] for c in RENDERED], ids=[c[0] for c in RENDERED]
)
def test_rendered_diagnostic(source: str, rendered: str) -> None:
    assert str(error_of(source)) == rendered


def test_control_characters_in_the_path_and_the_line_are_printed_escaped() -> None:
    """A path or a source line holding terminal escapes prints them as escapes, and the caret
    stays under the character the column names (the escape is wider than one column)."""
    err = error_of('variant v { doc "\x1b[2J"; score = score $ 1; }', file="b\x1b]0;x\x07.attn")
    assert str(err) == (
        "b\\x1b]0;x\\x07.attn:1:39: error: unexpected character '$'\n"
        '    variant v { doc "\\x1b[2J"; score = score $ 1; }\n'
        "                                             ^"
    )
    assert "\x1b" not in str(err) and "\x07" not in str(err)


@pytest.mark.parametrize(
    ("source", "loc", "message"),
    [
        ("foo", (1, 1), "expected 'variant', 'def' or 'import', found 'foo'"),
        ("variant", (1, 8), "expected a name, found end of file"),
        ("variant v", (1, 10), "expected '{', found end of file"),
        ("variant v {", (1, 12), "expected '}' to close variant 'v'"),
        (
            "variant v { 3 }",
            (1, 13),
            "expected a variant item (doc, param, let, normalize, "
            "kv_layout or an assignment) or '}', found '3'",
        ),
        ("variant v { score + 1; }", (1, 19), "expected '=', found '+'"),
        ("variant v { score = f(1,; }", (1, 25), "expected an expression, found ';'"),
        ("variant v { score = f(; }", (1, 23), "expected an expression or ')', found ';'"),
        (
            "variant v { score = t[1; }",
            (1, 24),
            "expected ',' or ']' after the expression, found ';'",
        ),
        ("variant v { score = a ? b; }", (1, 26), "expected ':' after the expression, found ';'"),
        ("variant v { score = 1 let }", (1, 23), "expected ';' after the expression, found 'let'"),
        ("variant v { normalize = 1; }", (1, 25), "expected a name, found '1'"),
        ("variant v { normalize = none }", (1, 30), "expected ';', found '}'"),
        ("variant v { kv_layout = paged || ragged; }", (1, 32), "expected a name, found '|'"),
        (
            "variant v { param p: tensor<bool>[3]; }",
            (1, 29),
            "expected 'f32' or 'i32', found 'bool'",
        ),
        (
            "variant v { param p: tensor<f32>[1.5]; }",
            (1, 34),
            "a tensor dimension must be an integer or a name",
        ),
        ("variant v { param p: tensor<f32>[4] = 1; }", (1, 37), "expected ';', found '='"),
        ("variant v { score = 1e39; }", (1, 21), "float literal '1e39' is out of range for f32"),
        ("variant v { doc = 1; }", (1, 17), "expected a string, found '='"),
        ('variant v { score = "s"; }', (1, 21), "expected an expression, found '\"s\"'"),
        (
            "variant v { score = true; let true = 1; }",
            (1, 31),
            "'true' is a keyword and cannot be used as a name",
        ),
        ("def f(a,) = a;", (1, 9), "expected a name, found ')'"),
        ("def f(a) = a", (1, 13), "expected ';' after the expression, found end of file"),
        ("import x;", (1, 8), "expected a string, found 'x'"),
        ('import "a.attn"', (1, 16), "expected ';', found end of file"),
        ("\x00", (1, 1), "unexpected character '\\x00'"),
        ("variant v { score = 1; }\n}", (2, 1), "expected 'variant', 'def' or 'import', found '}'"),
    ],
)
def test_message_and_location(source: str, loc: tuple[int, int], message: str) -> None:
    err = error_of(source)
    assert err.message == message
    assert (err.loc.line, err.loc.col) == loc
    assert err.loc.file == "bad.attn"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("", "expected an expression, found end of file"),
        (")", "expected an expression, found ')'"),
        ("1 +", "expected an expression, found end of file"),
        ("1 2", "expected end of file after the expression, found '2'"),
        (
            "99999999999999999999999999999999999999999999999",
            "integer literal '999999999999999999999...' is too large for i32 (at most 2147483647)",
        ),
    ],
)
def test_expression_errors(source: str, message: str) -> None:
    with pytest.raises(AttnError) as info:
        parse_expr(source)
    assert info.value.message == message


def test_deep_nesting_is_a_located_error() -> None:
    depth = 5000
    with pytest.raises(AttnError) as info:
        parse_expr("-" * depth + "x", "deep.attn")
    assert info.value.message == "expression nested too deeply (more than 2000 levels, the limit)"
    assert info.value.loc.file == "deep.attn"
    with pytest.raises(AttnError) as info:
        parse_expr("f(" * depth + "x" + ")" * depth)
    assert info.value.message == "expression nested too deeply (more than 2000 levels, the limit)"


def test_many_parentheses_do_not_nest_the_tree() -> None:
    assert parse_expr("(" * 3000 + "x" + ")" * 3000).loc == Loc("<string>", 1, 3001, 1, 3002)


def test_error_after_previous_line_points_after_last_token() -> None:
    err = error_of("def f(a) = a\n\n\n")
    assert err.loc == Loc("bad.attn", 1, 13, 1, 13)
    assert str(err) == (
        "bad.attn:1:13: error: expected ';' after the expression, found end of file\n"
        "    def f(a) = a\n"
        "                ^"
    )


def test_user_text_inside_a_message_is_printed_escaped(tmp_path) -> None:
    from attnc.compiler.pipeline import compile_source

    spec = tmp_path / "v.attn"
    spec.write_text('import "\x1b[2Jx.attn";\nvariant v { score = score; }\n')
    with pytest.raises(AttnError) as err:
        compile_source(spec.read_text(), str(spec))
    assert "import not found: '\\x1b[2Jx.attn'" in str(err.value)
    assert "\x1b" not in str(err.value)


def test_a_long_line_is_quoted_around_the_caret_only() -> None:
    """A 200 KB line quotes EXCERPT_CONTEXT characters each side of the caret, ``...`` at the
    cuts; the output once held the whole line and a caret line as long."""
    pad = " " * 200_000
    head, line, caret = str(error_of(f"variant v {{{pad}score = score $ 1;{pad}}}")).split("\n")
    assert head == "bad.attn:1:200026: error: unexpected character '$'"
    assert line == "    ..." + " " * (C - 14) + "score = score $ 1;" + " " * (C - 3) + "..."
    assert caret == "    " + " " * (3 + C) + "^"


def test_a_long_span_is_underlined_up_to_the_cut() -> None:
    text = "variant v { param w: i32 = " + "9" * 200_000 + "; }"
    _, line, caret = str(error_of(text)).split("\n")
    assert line == "    variant v { param w: i32 = " + "9" * (C + 1) + "..."
    assert caret == "    " + " " * 27 + "^" + "~" * C


@pytest.mark.parametrize(
    "before", ["", "\t\x1b", "漢字\t", "x" * (C - 30) + "\t\x1b\t", "a\x7f" * C]
)
def test_the_caret_stays_under_its_character_in_a_cut_line(before: str) -> None:
    """Tabs (one column) and escaped characters left of the caret, near or past the cut."""
    left = f'variant v {{ doc "{before}"; score = score '
    _, line, caret = str(error_of(left + "$ " + "z" * 3 * C)).split("\n")
    at = line.index("$")  # the caret counts terminal columns (漢字 takes 4)
    assert caret.index("^") == display_width(line[:at])
    assert line.endswith(" " + "z" * (C - 1) + "...")
    assert line.startswith("    ...") == (len(left) > C)
    assert "\t" not in line and "\x1b" not in line and "\x7f" not in line


@pytest.mark.parametrize(
    ("source", "col"),
    [
        ("variant v { param w: i32 = \u0661\u0662\u0668; }", 28),
        ("variant v { score = score * 1.\u0665; }", 31),
        ("variant v { param t: tensor<f32>[\uff14]; }", 34),
    ],
)
def test_numbers_are_ascii_digits_only(source: str, col: int) -> None:
    """The lexer's digits were Python's \\d, which reads any script's decimal digits: the
    first source below once declared w = 128."""
    err = error_of(source)
    assert err.loc.col == col and err.message.startswith("unexpected character '")


@pytest.mark.parametrize(
    ("after", "word"),
    [
        ("variant b {\n}\n", "variant"),
        ("def f() = 1.0;\n", "def"),
        ('import "x.attn";\n', "import"),
    ],
)
def test_a_variant_left_open_before_the_next_item_is_named(after: str, word: str) -> None:
    """The next item's keyword was read as an assignment's name, so the error came one token
    later: "expected '=', found 'b'"."""
    err = error_of("variant a {\n  score = score;\n\n" + after)
    assert err.message == f"expected '}}' to close variant 'a' before '{word}'"
    assert (err.loc.line, err.loc.col) == (4, 1)


@pytest.mark.parametrize(("line", "target", "prefix_columns"), [
    ("variant 變體 { score = 分数 + q; }", "q", 30),  # wide: 2 columns each
    ("let x = cafe\u0301 + zz;", "zz", 15),  # a combining accent takes none
    ("let x = 1; # \U0001f600 zz", "zz", 16),  # an emoji is wide
])  # fmt: skip
def test_caret_counts_terminal_columns(line: str, target: str, prefix_columns: int) -> None:
    from attnc.dsl.errors import Diagnostic

    col = line.index(target) + 1
    rendered = Diagnostic(Loc("x.attn", 1, col, 1, col + len(target)), "m", source_line=line)
    caret_line = rendered.render().splitlines()[-1]
    assert display_width(line[: col - 1]) == prefix_columns
    assert caret_line == " " * (4 + prefix_columns) + "^" + "~" * (len(target) - 1)
