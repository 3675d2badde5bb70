"""Hostile inputs to the front end: each one once gave a raw exception or a wrong result,
and now compiles correctly or fails with a located error."""

from __future__ import annotations

import math
import sys
import threading

import pytest
import torch

import attnc
from attnc.codegen import stages
from attnc.codegen.torch_ref import load_reference
from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.pipeline import compile_source
from attnc.dsl import ast
from attnc.dsl.errors import AttnError
from attnc.dsl.limits import RECURSION_LIMIT, deep_recursion
from attnc.dsl.parser import parse_expr


def test_integer_literal_with_thousands_of_leading_zeros_is_its_value() -> None:
    e = parse_expr("0" * 5000 + "17")
    assert isinstance(e, ast.Num) and e.value == 17 and not e.is_float


def test_long_zero_padded_literal_too_large_for_i32_is_located() -> None:
    text = "1 + " + "0" * 5000 + "4294967296"
    with pytest.raises(AttnError) as info:
        parse_expr(text, "z.attn")
    assert (info.value.loc.file, info.value.loc.col) == ("z.attn", 5)
    assert "too large for i32" in info.value.message


@pytest.mark.parametrize("stage", ["ir", "opt"])
def test_ir_dumps_escape_the_file_name_and_doc(stage: str) -> None:
    source = 'variant v {\n    doc "\u202egnp.exe \x1b[2J";\n    score = score;\n}\n'
    compiled, _ = compile_source(source, "dir\n*/x\x1b.attn")
    _, text = stages.emit_stage(compiled[0], stage)
    assert text.startswith("variant v  # dir\\n*/x\\x1b.attn\n  doc: \\u202egnp.exe \\x1b[2J\n")
    assert all(line.isprintable() for line in text.split("\n"))


@pytest.mark.parametrize("call", ["exp2(2000.0)", "exp(1000.0)", "exp2(1e30)"])
def test_exponentials_past_the_double_range_fold_to_inf(call: str) -> None:
    # min(score, inf) is score; folded to nan, every score of the kernels was nan.
    compiled, _ = compile_source(f"variant v {{ score = min(score, {call}); }}", "x.attn")
    score = compiled[0].variant.score
    assert isinstance(score, ir.Call) and score.args[1] == ir.Const(math.inf, ir.F32)
    assert evaluate(score, {"score": 1.5}) == 1.5


@pytest.mark.parametrize(
    "expr",
    ["min(c, score)", "min(score, c)", "max(c, score)", "max(score, c)", "clamp(c, score, 2.0)"],
)
@pytest.mark.parametrize("c", [math.nan, -math.inf, 0.5])
def test_reference_min_max_clamp_agree_with_the_kernels_on_nan(expr: str, c: float) -> None:
    # The kernels compute min as a < b ? a : b; torch.minimum gave nan for any nan operand.
    source = f"variant v {{ param c: f32 = 1.0; score = {expr}; }}"
    compiled, _ = compile_source(source, "x.attn")
    module = load_reference(compiled[0].variant)
    f64 = torch.float64
    env = {"score": torch.tensor(1.25, dtype=f64), "sm_scale": torch.tensor(1.0, dtype=f64)}
    env["c"] = torch.tensor(c, dtype=f64)
    got = float(module.score(env, {}))
    want = evaluate(compiled[0].variant.score, {"score": 1.25, "c": c})
    assert got == want or (math.isnan(got) and math.isnan(want))


GUARDED_READS = [
    "score = kv_idx < 4 ? score + t[kv_idx] : score;",
    "let x = t[kv_idx]; score = kv_idx < 4 ? score + x * x : score;",
    "mask = kv_idx < 4 && t[kv_idx] > 0.0;",
    "mask = kv_idx >= 4 || t[kv_idx] > 0.0;",
]


@pytest.mark.parametrize("body", GUARDED_READS)
def test_reference_reads_a_tensor_only_where_the_source_guards_it(body: str) -> None:
    # torch evaluates both branches; an IndexError came from keys the guard rules out.
    variant = attnc.load(f"variant g {{ param t: tensor<f32>[4]; {body} }}")
    q, k = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    out = variant.reference(q, k, k, t=torch.ones(4))
    assert out.shape == (6, 2, 8) and not out.isnan().any()


def test_an_unproven_read_out_of_range_reads_zero_in_the_reference() -> None:
    # t[kv_idx] may leave t (4 entries) for the 6 keys: the read is checked (the kernels'
    # load_in_shape_) and gives 0 outside the shape; the reference raised IndexError before.
    variant = attnc.load("variant g { param t: tensor<f32>[4]; score = score + t[kv_idx]; }")
    assert [w.message for w in variant.warnings if "may fall outside its dim 4" in w.message]
    q, k, v = torch.randn(6, 2, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    t = torch.tensor([0.5, -1.0, 2.0, 0.25])
    out = variant.reference(q, k, v, t=t)
    bias = torch.cat([t, torch.zeros(2)]).double()
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / 8**0.5 + bias
    want = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.double())
    assert torch.allclose(out.double(), want, atol=1e-5)


def test_a_compilation_leaving_keeps_the_recursion_room_of_another_thread() -> None:
    # The limit is the interpreter's: a compilation that started first and ended first put
    # it back while another thread's was deep inside its passes (a raw RecursionError).
    start = sys.getrecursionlimit()
    entered, release = threading.Event(), threading.Event()

    def first() -> None:
        with deep_recursion():
            entered.set()
            release.wait()

    thread = threading.Thread(target=first)
    thread.start()
    entered.wait()
    with deep_recursion():
        release.set()
        thread.join()
        assert sys.getrecursionlimit() >= RECURSION_LIMIT
        deep = "tanh(" * 1990 + "score" + ")" * 1990
        compiled, _ = compile_source(f"variant v {{ score = {deep}; }}", "x.attn")
        assert len(compiled) == 1
    assert sys.getrecursionlimit() == start


def test_the_printed_ast_on_stdout_holds_no_control_character(tmp_path, capsys) -> None:
    """`attnc compile F --emit ast` printed a doc string's ESC and bidi override as they were
    (the ir/opt/cuda dumps escaped them); a file written with -o keeps the source's text."""
    from attnc import cli

    spec = tmp_path / "v.attn"
    spec.write_text('variant v {\n    doc "\u202egnp.exe \x1b[2J";\n    score = score;\n}\n')
    assert cli.main(["compile", str(spec), "--emit", "ast"]) == 0
    out = capsys.readouterr().out
    assert "\\u202egnp.exe \\x1b[2J" in out and all(line.isprintable() for line in out.split("\n"))
    assert cli.main(["compile", str(spec), "--emit", "ast", "-o", str(tmp_path / "o")]) == 0
    assert "\u202egnp.exe \x1b[2J" in (tmp_path / "o" / "ast.attn").read_text()


@pytest.mark.parametrize(
    ("source", "words"),
    [("def f() = 1.0;\n", "defines no variant"), ("variant a {}\nvariant b {}\n", "several")],
)
def test_load_errors_escape_the_file_name(tmp_path, source, words) -> None:
    import attnc

    spec = tmp_path / "n\x1b[31m.attn"
    spec.write_text(source)
    with pytest.raises(ValueError, match=words) as err:
        attnc.load(str(spec))
    assert "\x1b" not in str(err.value) and "n\\x1b[31m.attn" in str(err.value)


def test_a_source_that_is_not_a_regular_file_is_named_before_reading(tmp_path, capsys) -> None:
    """`attnc check /dev/zero` read until memory ran out."""
    from attnc import cli

    assert cli.main(["check", "/dev/zero", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "/dev/zero: not a regular file" in err and f"{tmp_path}: Is a directory" in err


def test_a_source_past_the_size_limit_is_named(tmp_path, monkeypatch) -> None:
    from attnc.dsl import source_text

    monkeypatch.setattr(source_text, "MAX_SOURCE_BYTES", 64)
    spec = tmp_path / "big.attn"
    spec.write_text("variant v { score = score; }\n" + " " * 64)
    with pytest.raises(OSError, match="larger than 64 bytes, the limit of a .attn file"):
        source_text.read_source(str(spec))


def test_a_byte_order_mark_is_dropped(tmp_path) -> None:
    """A file saved with a UTF-8 BOM failed at 1:1 (unexpected character '\\ufeff')."""
    import attnc

    spec = tmp_path / "bom.attn"
    spec.write_bytes(b"\xef\xbb\xbfvariant bom { score = score; }\r\n")
    assert attnc.load(str(spec)).name == "bom"


def test_an_import_of_a_directory_says_it_is_not_a_file(tmp_path) -> None:
    from attnc.compiler.pipeline import compile_source

    (tmp_path / "sub.attn").mkdir()
    spec = tmp_path / "v.attn"
    spec.write_text('import "sub.attn";\nvariant v { score = score; }\n')
    with pytest.raises(AttnError, match="import is not a file: 'sub.attn'"):
        compile_source(spec.read_text(), str(spec))


_LONG_STRING_PROBE = """
import resource, sys
from attnc.dsl.parser import grammar_parser, parse_module
grammar_parser()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
module = parse_module('variant v { doc "' + 'a\\\\"b' * (2 << 20) + '"; mask = true; }', "big.attn")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
doc = module.items[0].items[0]
print((after - before) // 1024, len(doc.text), doc.text[:3])
"""


def test_a_long_string_parses_in_memory_near_its_size() -> None:
    """An 8 MiB doc string took about 1.5 GB to lex: the string's regex repeated a group of
    one character, and the regex engine kept state for each."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _LONG_STRING_PROBE], capture_output=True, text=True, check=True
    )
    grown, chars, start = done.stdout.split()
    grown_mib = int(grown)
    assert (int(chars), start) == (3 * (2 << 20), 'a"b')  # each a\"b read as three characters
    assert grown_mib < 400, f"parsing an 8 MiB string grew the process by {grown_mib} MiB"


@pytest.mark.parametrize(("sign", "error"), [("", True), ("-", False), ("+", True)])
def test_an_exponent_of_thousands_of_digits_is_located(sign: str, error: bool) -> None:
    """int() refuses more than 4300 digits: a raw ValueError with no location came out."""
    text = f"variant v {{ score = score * 1e{sign}{'9' * 4301}; }}"
    if error:
        with pytest.raises(AttnError, match="out of range for f32") as err:
            compile_source(text, "exp.attn")
        assert (err.value.loc.line, err.value.loc.col) == (1, 29)
    else:  # far below the smallest f32: zero
        (c,), _ = compile_source(text, "exp.attn")
        assert evaluate(c.variant.score, {"score": 3.0}) == 0.0


def test_a_lone_carriage_return_is_a_located_error() -> None:
    """CR-only line ends: the CR was a space, so a comment ran to the end of the file and
    the variants after it vanished ('ok (a)', then "has no variant 'b'")."""
    text = "variant a { score = score * 2.0; } # note\rvariant b { mask = kv_idx <= q_pos; }\r"
    with pytest.raises(AttnError, match="carriage return not followed by a line feed") as err:
        compile_source(text, "cr.attn")
    assert (err.value.loc.line, err.value.loc.col) == (1, 42)
    crlf = "variant a {\r\n    score = score * 2.0; # note\r\n}\r\n"
    (c,), _ = compile_source(crlf, "crlf.attn")
    assert c.variant.name == "a"
