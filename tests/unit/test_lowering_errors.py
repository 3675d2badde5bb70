"""Lowering errors: exact messages and locations, rendered carets, warnings and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnc.compiler.pipeline import STDLIB_DIR, compile_source, stdlib_names
from attnc.dsl.errors import AttnError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def error_of(text: str, file: str = "x.attn") -> AttnError:
    with pytest.raises(AttnError) as info:
        compile_source(text, file)
    return info.value


# (id, source, exact message, "line:col")
CASES = [
    (
        "unknown name",
        "variant v {\n    mask = kv_id <= q_pos;\n}\n",
        "unknown name 'kv_id' (did you mean 'kv_idx'?)",
        "2:12",
    ),
    (
        "assign built-in",
        "variant v {\n    q_idx = 1;\n}\n",
        "cannot assign to built-in 'q_idx': only score, mask, output and sink can be assigned",
        "2:5",
    ),
    (
        "unknown target",
        "variant v {\n    scor = 1.0;\n}\n",
        "unknown assignment target 'scor' (did you mean 'score'?); use 'let' for a local name",
        "2:5",
    ),
    (
        "duplicate param",
        "variant v {\n    param a: f32;\n    param a: i32;\n    score = score * a;\n}\n",
        "duplicate param 'a' (first declared at x.attn:2:5)",
        "3:5",
    ),
    (
        "duplicate let",
        "variant v {\n    let t = 1.0;\n    let t = 2.0;\n    score = t;\n}\n",
        "duplicate let 't' (first declared at x.attn:2:5)",
        "3:5",
    ),
    (
        "param and let share a name",
        "variant v {\n    param t: f32;\n    let t = 2.0;\n    score = t;\n}\n",
        "duplicate let 't' (first declared at x.attn:2:5)",
        "3:5",
    ),
    (
        "duplicate variant",
        "variant v {\n}\nvariant v {\n}\n",
        "duplicate variant 'v' (first defined at x.attn:1:1)",
        "3:1",
    ),
    (
        "duplicate def",
        "def f() = 1;\ndef f() = 2;\nvariant v {\n}\n",
        "duplicate def 'f' (first defined at x.attn:1:1)",
        "2:1",
    ),
    (
        "let shadows built-in",
        "variant v {\n    let score = 1.0;\n}\n",
        "let 'score' shadows the built-in 'score'",
        "2:5",
    ),
    (
        "mask not bool",
        "variant v {\n    mask = kv_idx - q_pos;\n}\n",
        "mask must be bool, got i32",
        "2:12",
    ),
    (
        "score bool",
        "variant v {\n    score = kv_idx < q_pos;\n}\n",
        "score must be a number (f32), got bool",
        "2:13",
    ),
    (
        "tensor index count",
        "variant v {\n    param t: tensor<f32>[num_qo_heads];\n"
        "    score = score + t[qo_head, kv_idx];\n}\n",
        "tensor 't' has 1 dimension(s) but is indexed with 2 index(es)",
        "3:21",
    ),
    (
        "float tensor index",
        "variant v {\n    param t: tensor<f32>[num_qo_heads];\n    score = score + t[score];\n}\n",
        "tensor index must be i32, got f32 (use int(...) to convert)",
        "3:23",
    ),
    (
        "division by zero",
        "variant v {\n    score = score / 0;\n}\n",
        "division by zero",
        "2:21",
    ),
    (
        "division by float zero",
        "variant v {\n    score = score / 0.0;\n}\n",
        "division by zero",
        "2:21",
    ),
    (
        "modulo by zero",
        "variant v {\n    mask = kv_idx % 0 == 1;\n}\n",
        "modulo by zero",
        "2:21",
    ),
    (
        "direct recursion",
        "def f(x) = f(x) + 1;\nvariant v {\n    score = f(score);\n}\n",
        "recursive def 'f' (f -> f); defs cannot recurse",
        "1:12",
    ),
    (
        "mutual recursion",
        "def f(x) = g(x);\ndef g(x) = f(x);\nvariant v {\n    score = f(score);\n}\n",
        "recursive def 'f' (f -> g -> f); defs cannot recurse",
        "2:12",
    ),
    (
        "unknown function",
        "variant v {\n    score = tanhh(score);\n}\n",
        "unknown function 'tanhh' (did you mean 'tanh'?)",
        "2:13",
    ),
    (
        "built-in arity",
        "variant v {\n    score = max(score);\n}\n",
        "'max' takes 2 argument(s), got 1",
        "2:13",
    ),
    (
        "def arity",
        "def f(x) = x;\nvariant v {\n    score = f(score, 1.0);\n}\n",
        "def 'f' takes 1 argument(s), got 2",
        "3:13",
    ),
    (
        "out outside output",
        "variant v {\n    score = out;\n}\n",
        "'out' can only be used in 'output = ...'",
        "2:13",
    ),
    (
        "mask uses score",
        "variant v {\n    mask = score > 0.0;\n}\n",
        "mask cannot use 'score'",
        "2:12",
    ),
    (
        "mask uses score through a let",
        "variant v {\n    let s2 = score * 2.0;\n    mask = s2 > 0.0;\n}\n",
        "mask cannot use 'score' (reached through a let or def)",
        "2:14",
    ),
    (
        "output uses kv_idx",
        "variant v {\n    output = out * kv_idx;\n}\n",
        "output cannot use 'kv_idx'",
        "2:20",
    ),
    (
        "output uses score",
        "variant v {\n    output = out * score;\n}\n",
        "output cannot use 'score'",
        "2:20",
    ),
    (
        "bad normalize",
        "variant v {\n    normalize = softmx;\n}\n",
        "normalize must be softmax or none, got 'softmx' (did you mean 'softmax'?)",
        "2:5",
    ),
    (
        "normalize twice",
        "variant v {\n    normalize = none;\n    normalize = softmax;\n}\n",
        "normalize is given twice (first at x.attn:2:5)",
        "3:5",
    ),
    (
        "mask twice",
        "variant v {\n    mask = true;\n    mask = false;\n}\n",
        "mask is given twice (first at x.attn:2:5)",
        "3:5",
    ),
    (
        "bad kv_layout",
        "variant v {\n    kv_layout = pagd;\n}\n",
        "unknown kv_layout 'pagd' (did you mean 'paged'?); expected paged, ragged or dense",
        "2:5",
    ),
    (
        "kv_layout twice in a list",
        "variant v {\n    kv_layout = paged | paged;\n}\n",
        "kv_layout 'paged' is listed twice",
        "2:5",
    ),
    (
        # The grammar has no default for tensor params: the parser stops at '='.
        "tensor param with default",
        "variant v {\n    param t: tensor<f32>[num_qo_heads] = 1.0;\n    score = t[qo_head];\n}\n",
        "expected ';', found '='",
        "2:40",
    ),
    (
        "f32 default is bool",
        "variant v {\n    param a: f32 = true;\n    score = a;\n}\n",
        "default of a f32 param must be a number, got bool",
        "2:20",
    ),
    (
        "i32 default is float",
        "variant v {\n    param a: i32 = 1.5;\n    score = score * a;\n}\n",
        "default of an i32 param must be an integer",
        "2:20",
    ),
    (
        "bool default is a number",
        "variant v {\n    param a: bool = 1;\n    mask = a;\n}\n",
        "default of a bool param must be true or false",
        "2:21",
    ),
    (
        "default is not a literal",
        "variant v {\n    param a: f32 = 1.0 + 2.0;\n    score = a;\n}\n",
        "a param default must be a literal (a number, true or false)",
        "2:20",
    ),
    (
        "i32 default too large",
        "variant v {\n    param a: i32 = 3000000000;\n    score = score * a;\n}\n",
        "integer literal '3000000000' is too large for i32 (at most 2147483647)",
        "2:20",
    ),
    (
        "tensor param used bare",
        "variant v {\n    param t: tensor<f32>[num_qo_heads];\n    score = score + t;\n}\n",
        "tensor param 't' must be indexed, e.g. t[qo_head]",
        "3:21",
    ),
    (
        "def used without call",
        "def c() = kv_idx <= q_pos;\nvariant v {\n    mask = c;\n}\n",
        "'c' is a def: call it as c(...)",
        "3:12",
    ),
    (
        "def body cannot see caller lets",
        "def f() = t;\nvariant v {\n    let t = 1.0;\n    score = f();\n}\n",
        "unknown name 't'",
        "1:11",
    ),
]


@pytest.mark.parametrize("text, message, where", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_message_and_location(text: str, message: str, where: str) -> None:
    err = error_of(text)
    assert err.message == message
    assert str(err.loc) == f"x.attn:{where}"


def test_rendered_unknown_name() -> None:
    err = error_of("variant v {\n    mask = kv_id <= q_pos;\n}\n")
    assert err.render() == (
        "x.attn:2:12: error: unknown name 'kv_id' (did you mean 'kv_idx'?)\n"
        "        mask = kv_id <= q_pos;\n"
        "               ^~~~~"
    )
    assert str(err) == err.render()


def test_rendered_mutual_recursion_points_into_def() -> None:
    err = error_of("def f(x) = g(x);\ndef g(x) = f(x);\nvariant v {\n    score = f(score);\n}\n")
    assert err.render() == (
        "x.attn:2:12: error: recursive def 'f' (f -> g -> f); defs cannot recurse\n"
        "    def g(x) = f(x);\n"
        "               ^~~~"
    )


def _write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_import_not_found(tmp_path) -> None:
    main = _write(tmp_path / "main.attn", 'import "nope.attn";\nvariant v {\n}\n')
    err = error_of(Path(main).read_text(), main)
    missing = os.path.join(str(tmp_path), "nope.attn")
    assert err.message == f"import not found: 'nope.attn' (looked for {missing})"
    assert str(err.loc) == f"{main}:1:1"


def test_cyclic_import(tmp_path) -> None:
    a = _write(tmp_path / "a.attn", 'import "b.attn";\nvariant va {\n}\n')
    b = _write(tmp_path / "b.attn", 'import "a.attn";\ndef h() = 1;\n')
    err = error_of(Path(a).read_text(), a)
    assert err.message == "cyclic import of 'a.attn' (a.attn -> b.attn -> a.attn)"
    assert str(err.loc) == f"{b}:1:1"


def test_duplicate_def_across_import(tmp_path) -> None:
    lib = _write(tmp_path / "lib.attn", "def causal() = kv_idx <= q_pos;\n")
    main = _write(
        tmp_path / "main.attn",
        'import "lib.attn";\ndef causal() = kv_idx < q_pos;\n'
        "variant v {\n    mask = causal();\n}\n",
    )
    err = error_of(Path(main).read_text(), main)
    assert err.message == f"duplicate def 'causal' (first defined at {lib}:1:1)"
    assert str(err.loc) == f"{main}:2:1"


def test_unused_param_warning() -> None:
    text = "variant v {\n    param a: f32 = 1.0;\n    param b: i32;\n    score = score * a;\n}\n"
    compiled, warnings = compile_source(text, "w.attn")
    assert [c.variant.name for c in compiled] == ["v"]
    assert [w.render() for w in warnings] == [
        "w.attn:3:5: warning: param 'b' is never used\n        param b: i32;\n        ^~~~~~~~~~~~~"
    ]


def test_param_used_only_as_tensor_index_is_used() -> None:
    text = (
        "variant v {\n    param t: tensor<f32>[4];\n    param i: i32;\n"
        "    score = score + t[i];\n}\n"
    )
    _, warnings = compile_source(text, "w.attn")
    # The index's range is unknown (index_range warns about that), but no param is unused.
    assert [w.message for w in warnings if "never used" in w.message] == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "attnc.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_cli_check_broken_file(tmp_path) -> None:
    path = _write(tmp_path / "bad.attn", "variant v {\n    mask = kv_id <= q_pos;\n}\n")
    proc = _cli("check", path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"{path}:2:12: error: unknown name 'kv_id' (did you mean 'kv_idx'?)\n"
        "        mask = kv_id <= q_pos;\n"
        "               ^~~~~\n"
    )
    assert "Traceback" not in proc.stderr


def test_cli_check_all_stdlib_files() -> None:
    files = sorted(f for f in os.listdir(STDLIB_DIR) if f.endswith(".attn"))
    assert [f[: -len(".attn")] for f in files if f != "masks.attn"] == stdlib_names()
    paths = [os.path.join(STDLIB_DIR, f) for f in files]
    proc = _cli("check", *paths)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    expected = [
        f"{p}: ok ({'no variants' if f == 'masks.attn' else f[: -len('.attn')]})"
        for p, f in zip(paths, files, strict=True)
    ]
    assert proc.stdout.splitlines() == expected


def test_a_built_in_reached_through_a_let_also_points_at_the_slot() -> None:
    # The error is at the forbidden use inside the let; a note shows the slot that reads it.
    text = (
        "variant v {\n    let s2 = score * 2.0;\n    let s3 = s2 + 1.0;\n    mask = s3 > 0.0;\n}\n"
    )
    error = error_of(text)
    assert str(error.loc) == "x.attn:2:14"
    assert [(str(n.loc), n.severity, n.message) for n in error.notes] == [
        ("x.attn:4:12", "note", "the mask that uses it")
    ]
    assert "x.attn:4:12: note: the mask that uses it\n" in str(error)


def test_a_built_in_reached_through_a_def_points_at_the_def_and_the_slot() -> None:
    text = "def f(a) = a + kv_idx;\nvariant v {\n    output = f(out);\n}\n"
    error = error_of(text)
    assert (str(error.loc), error.message) == (
        "x.attn:1:16",
        "output cannot use 'kv_idx' (reached through a let or def)",
    )
    assert [str(n.loc) for n in error.notes] == ["x.attn:3:14"]


def test_a_built_in_written_in_the_slot_has_no_note() -> None:
    assert error_of("variant v {\n    mask = score > 0.0;\n}\n").notes == ()


@pytest.mark.parametrize(
    "source",
    [
        "variant v { param a: i32 = -2147483648; score = score + float(a); }",
        "variant v { mask = q_pos - kv_idx > -2147483648; }",
        "variant v { mask = q_pos - kv_idx > -0002147483648; }",
        "variant v { param a: i32 = - 2147483648; score = score + float(a); }",
        "variant v { param a: i32 = -(2147483648); score = score + float(a); }",
    ],
)
def test_the_least_i32_can_be_written(source: str) -> None:
    """-2147483648 was refused ("integer literal '2147483648' is too large"; the minus
    applies after the literal is read), and so was ``-2147483647 - 1`` as a default (not a
    literal): the least i32 could only be passed at run time."""
    from attnc.codegen.cuda_expr import render_const
    from attnc.compiler import ir
    from attnc.compiler.ir_printer import format_variant

    (compiled,), _ = compile_source(source, "m.attn")
    assert "-2147483648" in format_variant(compiled.variant)
    assert "2147483647" not in format_variant(compiled.variant)
    assert render_const(ir.Const(-(2**31), ir.I32)) == "(-2147483647 - 1)"


def test_2147483648_alone_is_still_too_large() -> None:
    with pytest.raises(AttnError, match="'2147483648' is too large for i32"):
        compile_source("variant v { mask = kv_idx < 2147483648; }", "m.attn")


@pytest.mark.parametrize("sign", ["--", "+-", "-(-", "+(-"])
@pytest.mark.parametrize("dtype", ["i32", "f32"])
def test_a_second_sign_over_the_least_i32_is_not_a_literal_default(sign: str, dtype: str) -> None:
    """The least i32 is one negative literal; a sign over it is a second one, refused as over
    ``--5`` (``--2147483648`` said "does not fit in i32", and as an f32 default it, like
    ``+-2147483648`` and ``-(-2147483648)``, was taken)."""
    close = ")" if "(" in sign else ""
    score = "float(a)" if dtype == "i32" else "a"
    for literal in ("5", "2147483648"):
        source = (
            f"variant v {{ param a: {dtype} = {sign}{literal}{close}; score = score + {score}; }}"
        )
        with pytest.raises(AttnError, match="a param default must be a literal"):
            compile_source(source, "m.attn")


def test_2147483648_after_a_binary_minus_says_to_add_the_least_i32() -> None:
    """The hint said "-2147483648 may be written with its minus" where the minus was written
    (a binary one), and gave it for every too-large literal."""
    with pytest.raises(AttnError) as raised:
        compile_source("variant v { mask = kv_idx - 2147483648 < q_pos; }", "m.attn")
    assert raised.value.message == (
        "integer literal '2147483648' is too large for i32 (at most 2147483647; a unary minus "
        "applied to it, -2147483648, is the least i32: write x + -2147483648 for "
        "x - 2147483648)"
    )
