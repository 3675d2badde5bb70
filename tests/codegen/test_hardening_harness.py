"""Hostile names, file names and numbers compile with nvcc and the host harness agrees with the
reference: keyword and macro param names, names of the reference's own helpers, a file name
holding every control character, i32 wrap, folded inf/nan and a deep DAG of defs."""

from __future__ import annotations

import os
import shutil

import pytest
from host_fixture import HARNESS_MARKS

import attnc.testing.host_test as host_test
from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

pytestmark = HARNESS_MARKS

POINTS = 600


def compiled(text: str, file: str = "h.attn"):
    found, _ = compile_source(text, file)
    return found[0]


def assert_ok(c, **kwargs) -> None:
    report = run_host_test(c, points=POINTS, **kwargs)
    assert report.ok, report.summary()
    assert report.points > 0 and report.tiles > 0


KEYWORDS = "compl bitand not_eq thread_local INFINITY NAN NULL EOF ATTNC_HD p r row s o".split()


def test_param_names_that_are_cpp_keywords_and_macros() -> None:
    decls = "\n".join(f"    param {n}: i32 = {i + 1};" for i, n in enumerate(KEYWORDS))
    total = " + ".join(KEYWORDS)
    assert_ok(
        compiled(
            f"variant kw {{\n{decls}\n    score = score * float({total}) * 0.01;\n"
            f"    mask = kv_idx <= q_pos + compl;\n}}"
        )
    )


def test_param_names_of_the_reference_helpers() -> None:
    assert_ok(
        compiled(
            "variant ref_names { param _F: f32 = 2.0; param _device: i32 = 1; "
            "param torch: f32 = 0.5; param _wrap: i32 = 3; "
            "score = score * _F + torch * float(_device + _wrap); }"
        )
    )


def test_file_name_with_every_control_character(tmp_path) -> None:
    name = "z" + "".join(chr(c) for c in [*range(1, 32), 127]) + "*/\\"
    text = "variant ctl { param w: i32 = 9; mask = q_pos - kv_idx < w && kv_idx <= q_pos; }"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert_ok(compiled(text, f"dir/{name}.attn"))
    finally:
        os.chdir(cwd)
    assert not any(p.name.startswith("PWNED") for p in tmp_path.iterdir())


def test_i32_wrap_in_score_and_mask_agrees() -> None:
    c = compiled(
        "variant wrap { param n: i32 = 0; "
        "score = score + float(n + kv_idx) * 1e-9; mask = n + kv_idx <= q_pos; }"
    )
    for n in (2147483647, 2147483600, -2147483648, 5):
        assert_ok(c, fixed_params={"n": n})


def test_folded_inf_and_nan_agree() -> None:
    assert_ok(compiled("variant fold { score = max(score, -(3.0e38 * 10.0)) + 0.0 * 1.0; }"))
    assert_ok(compiled("variant fold_nan { output = out + 0.0 * (0.0 / (1.0 - 1.0)); }"))


def test_deep_dag_of_defs() -> None:
    defs = ["def g0(x) = x;"]
    defs += [f"def g{i}(x) = tanh(g{i - 1}(x)) * 0.5 + g{i - 1}(x) * 0.25;" for i in range(1, 31)]
    assert_ok(compiled("\n".join(defs) + "\nvariant deep { score = g30(score); }"))


def test_abs_of_the_most_negative_i32_wraps() -> None:
    # abs(-2147483648) wraps to -2147483648 in the language; C++'s -x there is undefined, so
    # the kernels' abs must not negate a signed int.
    c = compiled(
        "variant abs_min { param n: i32 = 0; "
        "score = score + float(abs(n + kv_idx) % 7) * 0.01; "
        "mask = abs(n + kv_idx) < 0 || kv_idx <= q_pos; }"
    )
    for n in (-2147483648, -2147483647 - 3, 5):
        assert_ok(c, fixed_params={"n": n})


def test_f32_remainder_compiles_and_is_fmod() -> None:
    # C++ has no % of floats: the functor did not compile for any f32 remainder.
    c = compiled(
        "variant frem { param c: f32 = 0.75; param t: tensor<f32>[kv_len]; "
        "score = score % c + float(kv_idx) % -2.5; "
        "mask = t[kv_idx] % 0.5 < 0.25 || kv_idx <= q_pos; "
        "sink = float(q_idx) % 3.0; output = out % 0.25; }"
    )
    for cap in (0.75, -0.3, 0.0):
        assert_ok(c, fixed_params={"c": cap})


def test_shared_lets_that_divide_in_a_mask_agree() -> None:
    # Each let uses the one before twice through / and %: the functor printed the unfolded
    # tree (3 MB at 16 lets); now each let is one local constant and the mask still agrees.
    n = 16
    lets = ["let a0 = kv_idx + q_pos * 7;"]
    lets += [f"let a{i} = a{i - 1} / 3 + a{i - 1} % 5;" for i in range(1, n + 1)]
    c = compiled(
        "variant divides { " + " ".join(lets) + f" mask = a{n} % 4 != 1 || kv_idx <= q_pos; }}"
    )
    assert_ok(c)


@pytest.mark.parametrize("n", [40, 45])
def test_mask_coefficients_past_int64_agree(n: int) -> None:
    # Each let triples q_idx: the constraints' coefficient 3^n was printed as a `...LL`
    # literal past the long long range. At 3^40 nvcc rejected the functor; at 3^45 it
    # truncated the literal and a 1 x 1 tile whose pair is visible was called EMPTY. Now
    # the mask is opaque and every tile PARTIAL.
    lets = ["let a0 = q_idx;"] + [f"let a{i} = a{i - 1} * 2 + a{i - 1};" for i in range(1, n + 1)]
    c = compiled(
        "variant tripled { param w: i32 = 5; param s: i32 = -5; "
        + " ".join(lets)
        + f" mask = a{n} + w >= 0 && a{n} + s <= 0; }}"
    )
    assert_ok(c, fixed_params={"w": 5, "s": -5})
    analysis = c.mask_analysis
    assert analysis.kind == "opaque"


def _address_sanitized(source: str, binary: str) -> list[str]:
    """g++ with AddressSanitizer: a read outside a tensor's array aborts the harness."""
    flags = ("-fsanitize=address", "-fno-omit-frame-pointer")
    return host_test.cxx_command("g++", source, binary, flags)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (AddressSanitizer)")
@pytest.mark.parametrize(
    "body",
    [
        "mask = kv_idx < 16 && {a} % 3 != 1;",
        "mask = kv_idx < 16 ? {a} % 3 != 1 : kv_idx <= q_pos;",
        "score = kv_idx < 16 && q_idx > 2 ? score + float({a} % 7) : score;",
    ],
)
def test_shared_guarded_tensor_reads_agree_and_stay_in_bounds(monkeypatch, body: str) -> None:
    # A chain of lets reading t[kv_idx] under 'kv_idx < 16' was printed as its unfolded tree
    # (2 GB at 16 lets); now each let is one local ahead of the guard, its read bounds-checked.
    # Keys past 16 (most drawn points) would read past the 16 ints of t if a plain read ran
    # ahead of its guard: the harness is built with AddressSanitizer, which aborts on such a
    # read.
    monkeypatch.setattr(host_test, "compiler_command", _address_sanitized)
    n = 16
    lets = ["let a0 = t[kv_idx] + t[kv_idx];"]
    lets += [f"let a{i} = a{i - 1} * a{i - 1} + a{i - 1};" for i in range(1, n + 1)]
    text = "variant guarded_reads { param t: tensor<i32>[16]; " + " ".join(lets)
    assert_ok(compiled(text + " " + body.format(a=f"a{n}") + " }"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (AddressSanitizer)")
def test_a_read_shared_by_separate_guards_agrees_and_stays_in_bounds(monkeypatch) -> None:
    # Each let uses the one before under two separate guards (the functor doubled with every
    # let before). The values under the guards must still be the reference's, and no read may
    # leave t (AddressSanitizer), also for keys where the guards are false.
    monkeypatch.setattr(host_test, "compiler_command", _address_sanitized)
    n = 16
    lets = ["let a0 = t[kv_idx] * 2;"]
    lets += [
        f"let a{i} = (kv_idx < 8 ? a{i - 1} : 1) + (kv_idx < 12 ? a{i - 1} : 2);"
        for i in range(1, n + 1)
    ]
    text = "variant separate_guards { param t: tensor<i32>[16]; " + " ".join(lets)
    assert_ok(compiled(text + f" mask = kv_idx < 16 && a{n} % 3 != 1; }}"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (AddressSanitizer)")
@pytest.mark.parametrize(
    ("decl", "read"),
    [
        ("tensor<f32>[num_qo_heads, 4]", "h[qo_head, kv_idx]"),  # two dims, the 2nd guarded
        ("tensor<f32>[3, num_kv_heads]", "h[kv_idx, kv_head]"),
        ("tensor<f32>[kv_len, 2]", "h[q_pos, 1] + h[kv_idx, 0]"),  # a request's slice
    ],
)
def test_bounds_checked_reads_of_every_tensor_shape(monkeypatch, decl: str, read: str) -> None:
    # The bounds-checked read (load_in_shape_) of a shared read under two separate guards:
    # the same values as the reference where the guards hold, no read outside the tensor.
    monkeypatch.setattr(host_test, "compiler_command", _address_sanitized)
    text = (
        f"variant checked_reads {{ param h: {decl}; let a0 = {read}; "
        "let a1 = (kv_idx < 2 ? a0 : 1.0) + (kv_idx < 3 ? a0 : 2.0); "
        "score = kv_idx < 3 ? score + a1 : score; }"
    )
    c = compiled(text)
    assert "load_in_shape_(p.p_h" in emit_functor(c)
    assert_ok(c)


def test_a_tmpdir_a_shell_would_expand_runs_nothing(tmp_path, monkeypatch) -> None:
    """The harness was built under TMPDIR, whose path nvcc hands its sub-tools on a shell
    command line: ``$(touch ...)`` in it ran."""
    import tempfile

    marker = tmp_path / "ran"
    hostile = tmp_path / f"t$(touch {marker})"
    hostile.mkdir(parents=True)  # the name holds slashes: nested directories
    monkeypatch.setenv("TMPDIR", str(hostile))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    found, _ = compile_source("variant v { mask = kv_idx <= q_pos; }", "v.attn")
    report = run_host_test(found[0], points=60)
    assert report.ok, report.summary()
    assert not marker.exists()
