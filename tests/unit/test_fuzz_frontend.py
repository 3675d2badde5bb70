"""Property tests of the front end.

(a) Token soup: any text either parses or fails with an AttnError located inside the text.
(b) Generated well-formed programs parse, and print -> parse -> print is a fixed point.
Successful parses are also fed to lowering: it may only fail with AttnError.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnc.compiler.lower import lower_modules
from attnc.dsl import ast
from attnc.dsl.errors import AttnError, Loc
from attnc.dsl.literals import KEYWORDS
from attnc.dsl.parser import parse_expr, parse_module
from attnc.dsl.printer import format_expr, format_module

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LANGUAGE_TOKENS = [
    *sorted(KEYWORDS),
    *"+ - * / % < > = ! ? : ; , ( ) [ ] { } |".split(),
    *"|| && == != <= >=".split(),
    "score", "mask", "kv_idx", "q_pos", "tanh", "x", "1", "0.5", "1e-3", "2147483648",
    '"doc text"', '"a\\"b"', "# comment\n", "\n", "none", "softmax", "paged",
    "doc", "sink", "kv_len", "q_len", "batch_size", "batch", "q_idx",
]  # fmt: skip
JUNK = ["$", "@", "`", "\\", "'", '"', "\x00", "\t", "\r", "\x0c", "é", "\u2028", ".", "1.2.3"]


def _lower(module: ast.Module) -> None:
    """Lower ``module`` alone (no imports); only AttnError may come out of it."""
    try:
        lower_modules([module])
    except AttnError:
        pass


def _assert_inside(loc: Loc, text: str, file: str) -> None:
    lines = text.split("\n")
    assert loc.file == file
    assert 1 <= loc.line <= len(lines), (loc, text)
    assert 1 <= loc.col <= len(lines[loc.line - 1]) + 1, (loc, text)


soup = st.lists(st.sampled_from(LANGUAGE_TOKENS + JUNK), max_size=40).map(
    lambda toks: " ".join(toks)
)
prefixed_soup = st.tuples(st.sampled_from(["variant v {", "def f(a) =", ""]), soup).map(
    lambda pair: pair[0] + " " + pair[1]
)


@FUZZ
@given(prefixed_soup)
def test_token_soup_parses_or_fails_with_located_error(text: str) -> None:
    try:
        module = parse_module(text, "soup.attn")
    except AttnError as err:
        _assert_inside(err.loc, text, "soup.attn")
        assert str(err).startswith(f"soup.attn:{err.loc.line}:{err.loc.col}: error: ")
        return
    _lower(module)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_never_escapes_as_another_exception(text: str) -> None:
    for parse in (parse_module, parse_expr):
        try:
            parse(text, "any.attn")
        except AttnError as err:
            _assert_inside(err.loc, text, "any.attn")


# ----------------------------------------------------------------------------- generated ASTs
BUILTINS = ["score", "sm_scale", "q_idx", "q_pos", "kv_idx", "q_len", "kv_len", "qo_head"]
names = st.one_of(
    st.sampled_from(BUILTINS),
    st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: n not in KEYWORDS),
)
ints = st.integers(min_value=0, max_value=2**31 - 1).map(lambda v: ast.Num(v, False))
floats = st.floats(min_value=0.0, max_value=3.0e38, allow_nan=False, allow_infinity=False).map(
    lambda v: ast.Num(v, True)
)
leaves = st.one_of(ints, floats, st.booleans().map(ast.BoolLit), names.map(ast.Name))
BINARY_OPS = ["+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||"]


def _compound(children: st.SearchStrategy[ast.Expr]) -> st.SearchStrategy[ast.Expr]:
    args = st.lists(children, max_size=3).map(tuple)
    return st.one_of(
        st.builds(ast.Unary, st.sampled_from(["-", "!", "+"]), children),
        st.builds(ast.Binary, st.sampled_from(BINARY_OPS), children, children),
        st.builds(ast.Ternary, children, children, children),
        st.builds(ast.Call, names, args),
        st.builds(ast.Index, names, st.lists(children, min_size=1, max_size=3).map(tuple)),
    )


exprs = st.recursive(leaves, _compound, max_leaves=16)
doc_texts = st.text(
    alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=12
)
scalar_types = st.sampled_from(["f32", "i32", "bool"]).map(ast.ScalarType)
dims = st.lists(st.one_of(names.map(ast.Name), ints), min_size=1, max_size=3).map(tuple)
tensor_types = st.builds(ast.TensorType, st.sampled_from(["f32", "i32"]), dims)
variant_items = st.one_of(
    st.builds(ast.Doc, doc_texts),
    st.builds(ast.Param, names, scalar_types, st.one_of(st.none(), exprs)),
    st.builds(ast.Param, names, tensor_types, st.none()),
    st.builds(ast.Let, names, exprs),
    st.builds(ast.Assign, st.sampled_from(["score", "mask", "output"]), exprs),
    st.builds(ast.Normalize, st.sampled_from(["softmax", "none"])),
    st.builds(ast.KvLayout, st.lists(names, min_size=1, max_size=3).map(tuple)),
)
top_items = st.one_of(
    st.builds(ast.Import, doc_texts),
    st.builds(ast.Def, names, st.lists(names, max_size=3).map(tuple), exprs),
    st.builds(ast.Variant, names, st.lists(variant_items, max_size=6).map(tuple)),
)
modules = st.builds(ast.Module, st.just("gen.attn"), st.lists(top_items, max_size=4).map(tuple))


@FUZZ
@given(exprs)
def test_generated_expression_round_trips(expr: ast.Expr) -> None:
    text = format_expr(expr)
    parsed = parse_expr(text)
    assert parsed == expr
    assert format_expr(parsed) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules)
def test_generated_module_round_trips(module: ast.Module) -> None:
    text = format_module(module)
    parsed = parse_module(text, "gen.attn")
    assert parsed == module
    assert format_module(parsed) == text
    _lower(parsed)
