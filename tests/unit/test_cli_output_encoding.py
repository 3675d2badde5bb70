"""The CLI writes to a stdout or stderr whose encoding lacks a character of a file name or of
user text by escaping that character: no command stops there, and ``check`` checks every file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from attnc.cli import main

REPO = str(Path(__file__).resolve().parents[2])
GOOD = "variant v { mask = q_pos < kv_idx; }\n"
BAD = "variant v { mask = q_pos < nope; }\n"


def _ascii_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONIOENCODING="ascii", PYTHONPATH=REPO, ATTNC_CACHE_DIR=str(cwd / "cache")
    )
    return subprocess.run(
        [sys.executable, "-m", "attnc.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_check_goes_on_after_a_name_stdout_cannot_encode(tmp_path):
    (tmp_path / "日本.attn").write_text(GOOD)
    (tmp_path / "bad.attn").write_text(BAD)
    done = _ascii_cli(tmp_path, "check", "日本.attn", "gone日本.attn", "bad.attn")
    assert done.returncode == 1
    assert done.stdout == "\\u65e5\\u672c.attn: ok (v)\n"
    assert "attnc: error: gone\\u65e5\\u672c.attn: No such file or directory" in done.stderr
    assert "bad.attn:1:28: error: unknown name 'nope'" in done.stderr
    assert "codec" not in done.stderr


def test_compile_prints_user_text_stdout_cannot_encode(tmp_path):
    (tmp_path / "doc.attn").write_text('variant v { doc "注意"; mask = q_pos < kv_idx; }\n')
    done = _ascii_cli(tmp_path, "compile", "doc.attn", "--emit", "ir")
    assert done.returncode == 0, done.stderr
    assert "doc: \\u6ce8\\u610f" in done.stdout
    done = _ascii_cli(tmp_path, "compile", "doc.attn", "--emit", "ir", "-o", "出力")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote \\u51fa\\u529b/v.ir\n"


def test_main_gives_the_streams_their_error_handlers_back(tmp_path, capsys):
    path = tmp_path / "good.attn"
    path.write_text(GOOD)
    before = (sys.stdout.errors, sys.stderr.errors)
    assert main(["check", str(path)]) == 0
    assert (sys.stdout.errors, sys.stderr.errors) == before
    assert capsys.readouterr().out.endswith("good.attn: ok (v)\n")


def test_overlapping_calls_give_the_streams_their_own_handler_back(monkeypatch):
    """Each call put back the handler it found: a call that began while another ran, and
    ended after it, found the other's backslashreplace and left it on stdout for good."""
    import io
    import threading

    from attnc import cli

    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def run(argv):
        if argv == ["first"]:
            first_in.set()
            second_in.wait(10)
        else:
            second_in.set()
            first_out.wait(10)
        return 0

    monkeypatch.setattr(cli, "_run", run)
    first = threading.Thread(target=cli.main, args=(["first"],))
    second = threading.Thread(target=cli.main, args=(["second"],))
    first.start()
    first_in.wait(10)
    second.start()
    first.join()  # the first ends while the second runs
    first_out.set()
    second.join()
    assert stdout.errors == "strict"
