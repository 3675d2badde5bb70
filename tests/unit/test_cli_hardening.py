"""The CLI's edges: --param goes through the API's param checks (did-you-mean, types, ranges,
no tensors), --points is bounded, a closed pipe ends quietly, --version, ATTNC_NVCC reaches
the host harness, help(attnc) lists the lazy names, and the README says what CI runs."""

from __future__ import annotations

import os
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest

import attnc
from attnc import cli
from attnc.dsl.errors import printable
from attnc.runtime.build.toolchain import ToolNotFound
from attnc.testing import host_test

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_harness(monkeypatch):
    seen: list[dict[str, object]] = []

    def fake_run(c, *, points, seed, fixed_params):
        seen.append(dict(fixed_params))
        return host_test.HostTestReport(c.variant.name)

    monkeypatch.setattr(host_test, "run_host_test", fake_run)
    return seen


def _test(capsys, *args):
    status = cli.main(["test", *args, "--no-gpu"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "param", "message"),
    [
        ("stdlib:softcap", "capp=3", "unknown param 'capp'; did you mean 'cap'?"),
        ("stdlib:alibi", "slopes=1.0", "--param slopes (tensor<f32>[num_qo_heads]): a tensor"),
        ("stdlib:softcap", "cap=abc", "--param cap (f32): expected a number, got 'abc'"),
        ("stdlib:softcap", "cap=1e39", "--param cap (f32): '1e39' is out of the f32 range"),
        ("stdlib:softcap", "cap=1e400", "--param cap (f32): '1e400' is out of the f32 range"),
        ("stdlib:softcap", "cap=\u0661\u0662", "--param cap (f32): expected a number, got '\u0661"),
        ("stdlib:softcap", "cap=1_0", "--param cap (f32): expected a number, got '1_0'"),
        ("stdlib:softcap", "cap=0x10", "--param cap (f32): expected a number, got '0x10'"),
        ("stdlib:sliding_window", "window=2147483648", "param 'window' (i32): value 2147483648"),
        ("stdlib:sliding_window", "window=1.5", "--param window (i32): expected an integer"),
        ("stdlib:sliding_window", "window=\u0661\u0662", "(i32): expected an integer, got '\u0661"),
        # int() refuses more than 4300 digits: its own message named no param
        ("stdlib:sliding_window", "window=" + "9" * 5000, "--param window (i32): '9999"),
        ("stdlib:softcap", "cap=" + "9" * 5000, "--param cap (f32): '9999"),
        ("stdlib:softcap", "=3", "expects NAME=VALUE"),
        ("stdlib:softcap", "cap", "expects NAME=VALUE"),
    ],
)
def test_bad_params_are_errors_that_name_the_param(capsys, no_harness, spec, param, message):
    status, err = _test(capsys, spec, "--param", param)
    assert status == 1
    assert message in err, err
    assert not no_harness


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("inf", float("inf")),
        ("-Infinity", float("-inf")),
        ("3.4028235e38", 3.4028235e38),
        (".5e-3", 0.0005),
        ("+7.", 7.0),
    ],
)
def test_f32_params_the_api_takes_are_taken(capsys, no_harness, text, value):
    """Written inf (which the Python API takes) and numbers float32 rounds to its maximum
    were refused as out of the f32 range."""
    status, err = _test(capsys, "stdlib:softcap", "--param", f"cap={text}")
    assert status == 0, err
    assert no_harness == [{"cap": value}]


def test_good_params_reach_the_harness_typed(capsys, no_harness):
    status, _ = _test(capsys, "stdlib:softcap", "--param", "cap=3")
    assert status == 0 and no_harness == [{"cap": 3.0}]
    status, _ = _test(capsys, "stdlib:sliding_window", "--param", "window=-4")
    assert status == 0 and no_harness[-1] == {"window": -4}


@pytest.mark.parametrize("points", ["100000000", "0", "-3", "many"])
def test_points_is_bounded(capsys, points):
    with pytest.raises(SystemExit) as exc:
        cli.main(["test", "stdlib:causal", "--points", points])
    assert exc.value.code == 2
    assert "--points" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [str(2**64), str(-(2**63) - 1), "1.5"])
def test_seed_out_of_torch_range_names_the_argument(capsys, no_harness, seed):
    # 2**64 once reached torch.manual_seed: "attnc: error: Overflow when unpacking long long".
    with pytest.raises(SystemExit) as exc:
        cli.main(["test", "stdlib:causal", "--no-gpu", "--seed", seed])
    assert exc.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [str(2**64 - 1), "-1"])
def test_seeds_in_range_reach_the_harness(capsys, no_harness, seed):
    assert cli.main(["test", "stdlib:causal", "--no-gpu", "--seed", seed]) == 0


@pytest.mark.parametrize("jobs", ["0", "-3", "many", "\x1b[31m"])
def test_build_jobs_must_be_positive(capsys, jobs):
    with pytest.raises(SystemExit) as exc:
        cli.main(["build", "stdlib:causal", "--arch", "80", "-j", jobs])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "-j/--jobs" in err and "\x1b" not in err


# Python's int() reads every script's decimal digits ("\u0661\u0662\u0668" is 128), "1_28"
# and surrounding spaces; the command line takes an optional sign and ASCII digits.
NOT_ASCII_INTEGERS = ["\u0661\u0662\u0668", "\uff11\uff12\uff18", "1_28", " 128"]


@pytest.mark.parametrize("text", NOT_ASCII_INTEGERS)
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["test", "stdlib:causal", "--no-gpu", "--seed"], "--seed"),
        (["test", "stdlib:causal", "--no-gpu", "--points"], "--points"),
        (["build", "stdlib:causal", "--arch", "80", "-j"], "-j/--jobs"),
    ],
)
def test_integer_options_take_ascii_digits_only(capsys, no_harness, args, option, text):
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, text])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {option}: expected an integer, got '{text}'" in err
    assert not no_harness


@pytest.mark.parametrize("text", NOT_ASCII_INTEGERS[:2])
def test_build_head_dim_takes_ascii_digits_only(capsys, monkeypatch, text):
    from attnc.runtime.build import aot, variant_cache

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before --head-dim was checked")

    monkeypatch.setattr(variant_cache, "compile_cached", no_compile)
    status = cli.main(["build", "stdlib:causal", "--arch", "80", "--head-dim", f"64,{text}"])
    err = capsys.readouterr().err
    assert (
        status == 1
        and f"--head-dim: expected 64, 128, 256 (comma separated), got '64,{text}'" in err
    )
    assert aot.parse_head_dims(" 128, 64,128") == (128, 64)


@pytest.mark.parametrize("text", ["+3", "-0", "007"])
def test_signed_ascii_integers_are_taken(capsys, no_harness, text):
    assert cli.main(["test", "stdlib:causal", "--no-gpu", "--seed", text]) == 0


def test_build_refuses_an_old_arch_before_compiling(capsys, monkeypatch):
    from attnc.runtime.build import variant_cache

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the arch was checked")

    monkeypatch.setattr(variant_cache, "compile_cached", no_compile)
    status = cli.main(["build", "stdlib:causal", "--arch", "75"])
    err = capsys.readouterr().err
    assert status == 1 and "arch '75'" in err and "sm_80 and newer" in err


@pytest.mark.parametrize(
    "args",
    [
        ("--param", "cap=\x1b[31m"),
        ("--param", "\x1b[31m=1"),
        ("--param", "\x1b[31m"),
        ("--variant", "\x1b[31m"),
    ],
)
def test_bad_text_is_echoed_escaped(capsys, no_harness, args):
    status, err = _test(capsys, "stdlib:softcap", *args)
    assert status == 1 and "\\x1b[31m" in err and "\x1b" not in err


def test_output_paths_are_printed_escaped(capsys, tmp_path, monkeypatch):
    out = tmp_path / "o\x1b[2J"
    assert cli.main(["compile", "stdlib:causal", "-o", str(out)]) == 0
    assert (out / "causal.cuh").is_file()
    printed = capsys.readouterr().out
    assert "o\\x1b[2J/causal.cuh" in printed and "\x1b" not in printed

    from attnc.runtime.build import aot

    def fake_build(chosen, arch, dtypes, head_dims, kind, jobs=None, progress=None):
        module = aot.AotModule("causal", "prefill", "bfloat16", 128, None, arch)
        return [(module, str(out / "m.so"))]

    monkeypatch.setattr(aot, "build_deployment", fake_build)
    assert cli.main(["build", "stdlib:causal", "--arch", "80", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "o\\x1b[2J/m.so" in captured.out and "\x1b" not in captured.out + captured.err


def test_api_errors_echo_names_escaped():
    with pytest.raises(ValueError) as err:
        attnc.load("stdlib:softcap", variant="\x1bq")
    assert "'\\x1bq'" in str(err.value) and "\x1b" not in str(err.value)
    from attnc.runtime.checks.params import check_plan_params

    decls = attnc.load("stdlib:softcap").compiled.variant.params
    with pytest.raises(ValueError) as err:
        check_plan_params(decls, {"\x1bcap": 1.0}, variant_name="softcap")
    assert "\\x1bcap" in str(err.value) and "\x1b" not in str(err.value)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnc {attnc.__version__}"


def test_closed_pipe_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from attnc.cli import main; sys.exit(main())", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Broken pipe" not in err and "Traceback" not in err


def test_host_harness_uses_attnc_nvcc(monkeypatch, tmp_path):
    fake = tmp_path / "my-nvcc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ATTNC_NVCC", str(fake))
    assert host_test.compiler_command("/w/harness.cu", "/w/harness")[0] == str(fake)


@pytest.mark.parametrize("value", ["/nonexistent/nvcc", "/tmp/nv\ncc"])
def test_host_harness_names_an_attnc_nvcc_it_cannot_run(monkeypatch, capsys, value):
    """``attnc test`` with ATTNC_NVCC set to a missing path (or one holding a newline)
    ended in a bare '[Errno 2] No such file or directory'; the kernel builds name the
    variable and its value, and so does the host harness now."""
    monkeypatch.setenv("ATTNC_NVCC", value)
    with pytest.raises(ToolNotFound, match=r"ATTNC_NVCC is '"):
        host_test.compiler_command("/w/harness.cu", "/w/harness")
    assert cli.main(["test", "stdlib:causal", "--no-gpu"]) == 1
    err = capsys.readouterr().err
    assert "ATTNC_NVCC is '" in err and "Errno" not in err


def test_help_lists_the_lazy_public_names():
    names = ("load", "Variant", "BatchPrefillWrapper", "BatchDecodeWrapper", "merge_state")
    assert set(names) <= set(dir(attnc)) and set(names) <= set(attnc.__all__)
    text = pydoc.render_doc(attnc, renderer=pydoc.plaintext)
    for name in names:
        assert name in text
    assert "def load" in text or "load(" in text


def test_readme_states_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    commands = [
        line.strip()
        for line in ci.splitlines()
        if line.strip().startswith(("ruff ", "mypy ", "python -m pytest"))
    ]
    assert len(commands) >= 4
    for command in commands:
        assert command in readme, command


@pytest.mark.parametrize("name", ["o\x1b[2J.attn", "bad\udcff.attn"])
def test_check_echoes_the_checked_path_escaped(capsys, tmp_path, name):
    path = tmp_path / name
    path.write_text("variant v { score = score; }\n", encoding="utf-8")
    assert cli.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(": ok (v)\n") and out.isascii() and out[:-1].isprintable()


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "stdlib:causal", "--arch", "80", "\x1b]0;PWNED\x07\x1b[2J"],
        ["list", "X\x1b[2J"],
        ["check", "stdlib:causal", "--x\x1b[31m"],
    ],
    ids=["unrecognized", "list-extra", "unknown-option"],
)
def test_argparse_errors_print_control_characters_as_escapes(capsys, argv):
    """'unrecognized arguments: ...' quoted the argument raw: an escape sequence in it set
    the terminal's title and cleared the screen."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "\x1b" not in err and "\x07" not in err
    assert "\\x1b" in err and "attnc" in err


@pytest.mark.parametrize("command", [["build", "--arch", "80"], ["test", "--no-gpu"], ["compile"]])
def test_a_file_without_variants_is_an_error_for_commands_that_work_on_variants(capsys, command):
    """attnc build stdlib:masks built the shared modules only and exited 0."""
    status = cli.main([command[0], "stdlib:masks", *command[1:]])
    assert status == 1 and "defines no variant" in capsys.readouterr().err
    assert cli.main(["check", "stdlib:masks"]) == 0


@pytest.mark.parametrize("command", [["build", "--arch", "80"], ["compile", "--emit", "cuda"]])
@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_an_output_dir_that_is_a_bad_link_is_named(capsys, tmp_path, command, link):
    """-o of a link loop printed Python's 'Symlink loop from ...' (build) or a bare '[Errno
    17] File exists' (compile); a link to nothing had its target tree created by build."""
    out = tmp_path / "out"
    if link == "loop":
        (tmp_path / "other").symlink_to(out)
        out.symlink_to(tmp_path / "other")
        words = "a symbolic link that loops"
    else:
        out.symlink_to(tmp_path / "nowhere" / "deep")
        words = "a symbolic link to nothing"
    status = cli.main([command[0], "stdlib:causal", *command[1:], "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 1 and f"-o: {out} is {words}" in err
    assert not (tmp_path / "nowhere").exists()


def test_build_output_dir_through_a_link_and_dotdot_is_the_one_checked(tmp_path, monkeypatch):
    """-o link/../out used <cwd>/out (the text's ..), while the kernel, and the checks, go
    through the link first: <link target>/../out."""
    from attnc.runtime.build import aot

    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "link").symlink_to(tmp_path / "elsewhere" / "sub")
    monkeypatch.chdir(tmp_path / "cwd")
    seen = []
    monkeypatch.setattr(
        aot, "build_deployment", lambda *a, **k: seen.append(os.environ["ATTNC_CACHE_DIR"]) or []
    )
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "unused"))
    assert cli.main(["build", "stdlib:causal", "--arch", "80", "-o", "link/../out"]) == 0
    assert seen == [str(tmp_path / "elsewhere" / "out")]


@pytest.mark.parametrize("before", [None, "mine"])
def test_build_output_dir_is_the_cache_root_for_the_build_only(tmp_path, monkeypatch, before):
    """-o set ATTNC_CACHE_DIR in the calling process and left it there, even when the build
    failed: every later load and build of a program that called main() used the -o folder."""
    if before is None:
        monkeypatch.delenv("ATTNC_CACHE_DIR", raising=False)
    else:
        monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / before))
    out = tmp_path / "aot"
    argv = ["build", "stdlib:causal", "--arch", "80", "-o", str(out), "--variant", "typo"]
    assert cli.main(argv) == 1
    expected = None if before is None else str(tmp_path / before)
    assert os.environ.get("ATTNC_CACHE_DIR") == expected


@pytest.mark.parametrize(
    "command", [["compile", "stdlib:causal"], ["build", "stdlib:causal", "--arch", "80"]]
)
@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("out\x00dir", "a path cannot hold a NUL byte"),
        ("out\ud800dir", "a path cannot hold this character"),
    ],
)
def test_an_output_dir_no_path_can_be_is_named(capsys, command, path, why):
    """-o with a NUL byte gave "attnc: error: embedded null byte", naming neither -o nor the
    path; with a lone surrogate, a UnicodeEncodeError's text."""
    assert cli.main([*command, "-o", path]) == 1
    err = capsys.readouterr().err
    assert f"attnc: error: -o: {printable(path)}: {why}" in err


def test_a_source_path_with_a_lone_surrogate_is_not_called_a_nul_byte():
    with pytest.raises(FileNotFoundError, match="the file system cannot encode one of its"):
        attnc.load("models/a\ud800.attn")
