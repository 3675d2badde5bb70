"""How imports are found, identified and recorded for the compiled-variant cache.

Each test failed before its fix:
- an import skipped as already loaded (the same file through another spelling, a link) was
  not recorded in the cache entry, so replacing the link and deleting the file it named still
  gave the cached variant where a fresh compile says the import is missing;
- a relative path starting with ``<`` was taken for inline source: its imports resolved from
  the working directory (a decoy ``lib.attn`` there was compiled in);
- ``..`` was collapsed before links were followed (``link/../lib.attn`` read the importer's
  sibling, not the link target's) and ``lib.attn/`` was read as the file;
- a loop of links was "import not found";
- a parse error in an imported file gave its line and column but no reason and no caret.
- the error at the import of a file it must not quote held the error quoting the file as its
  ``__context__``;
- an import error's traceback frames held the file's bytes and text as locals.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import attnc
from attnc.compiler.pipeline import compile_source
from attnc.compiler.sources import STDLIB_DIR as STDLIB
from attnc.compiler.sources import resolve_source
from attnc.dsl.errors import AttnError

REPO = str(Path(__file__).resolve().parents[2])
WINDOW_USER = "variant v { mask = q_pos - kv_idx < w(); }\n"


def _window(spec: str) -> int:
    compiled, _ = compile_source(*resolve_source(spec))
    return compiled[0].variant.mask.b.value


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("a_kept", "words"),
    [
        (False, "import not found: 'a.attn'"),  # the file the skipped spelling named is gone
        (True, "'w'"),  # two files now: a fresh compile sees w defined twice
    ],
)
def test_an_import_skipped_under_another_spelling_is_checked_on_a_cache_hit(
    cache: Path, a_kept: bool, words: str
) -> None:
    (cache / "a.attn").write_text("def w() = 4;\n")
    (cache / "b.attn").symlink_to("a.attn")
    main = cache / "main.attn"
    main.write_text('import "b.attn";\nimport "a.attn";\n' + WINDOW_USER)
    attnc.load(str(main))
    (cache / "b.attn").unlink()
    (cache / "b.attn").write_text("def w() = 4;\n")  # the link replaced by a copy
    if not a_kept:
        (cache / "a.attn").unlink()
    with pytest.raises(AttnError, match=words):
        attnc.load(str(main))


def test_a_relative_path_starting_with_an_angle_bracket_is_a_file(
    tmp_path: Path, monkeypatch
) -> None:
    project = tmp_path / "<proj>"
    project.mkdir()
    (project / "lib.attn").write_text("def w() = 4;\n")
    (project / "main.attn").write_text('import "lib.attn";\n' + WINDOW_USER)
    (tmp_path / "lib.attn").write_text("def w() = 1000;\n")  # a decoy in the working dir
    monkeypatch.chdir(tmp_path)
    assert _window("<proj>/main.attn") == 4


def test_dot_dot_after_a_link_is_resolved_by_the_system(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "vendor" / "pkg").mkdir(parents=True)
    (tmp_path / "vendor" / "lib.attn").write_text("def w() = 4;\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "lib.attn").write_text("def w() = 999;\n")
    (proj / "link").symlink_to(tmp_path / "vendor" / "pkg")
    (proj / "main.attn").write_text('import "link/../lib.attn";\n' + WINDOW_USER)
    (tmp_path / "vendor" / "main.attn").write_text('import "lib.attn";\n' + WINDOW_USER)
    monkeypatch.chdir(proj)
    assert _window("main.attn") == 4  # what `cat link/../lib.attn` shows
    assert _window("link/../main.attn") == 4  # vendor/main.attn, its imports from vendor/


def test_a_trailing_separator_is_no_file(tmp_path: Path) -> None:
    (tmp_path / "lib.attn").write_text("def w() = 4;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "lib.attn/";\n' + WINDOW_USER)
    with pytest.raises(AttnError, match="import not found: 'lib.attn/'"):
        _window(str(main))


def test_a_loop_of_links_is_named(tmp_path: Path) -> None:
    os.symlink("l2.attn", tmp_path / "l1.attn")
    os.symlink("l1.attn", tmp_path / "l2.attn")
    main = tmp_path / "main.attn"
    main.write_text('import "l1.attn";\nvariant v { }\n')
    with pytest.raises(AttnError, match="cannot read import 'l1.attn': Too many levels"):
        _window(str(main))


def test_a_parse_error_in_an_import_is_shown_there_with_a_note_at_the_import(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "lib.attn").write_text("def f(x) = x +* 2;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "sub/lib.attn";\nvariant v { mask = q_pos < f(kv_idx); }\n')
    with pytest.raises(AttnError) as raised:
        _window(str(main))
    lines = str(raised.value).splitlines()
    assert lines[0].endswith("sub/lib.attn:1:15: error: expected an expression, found '*'")
    assert lines[1:3] == ["    def f(x) = x +* 2;", "                  ^"]
    assert lines[3] == f"{main}:1:1: note: in the file imported here as 'sub/lib.attn'"


def test_loads_work_from_a_removed_working_directory(tmp_path: Path) -> None:
    """Every cached load asked for the working directory: from a removed one, even
    ``stdlib:`` and absolute paths raised FileNotFoundError. (A fresh interpreter: a test
    runner's worker needs its own working directory.)"""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, torch, attnc\n"  # torch's own libraries do not load from a removed one
        f"os.rmdir({str(gone)!r})\n"
        "print(attnc.load('stdlib:causal').ir.name)\n"
        f"print(attnc.load({os.path.join(STDLIB, 'sliding_window.attn')!r}).ir.name)\n"
    )
    env = dict(os.environ, ATTNC_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=gone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "causal\nsliding_window\n"


def test_a_missing_import_is_shown_as_looked_for(tmp_path: Path) -> None:
    """``./`` dropped, ``..`` kept: collapsing it by its text named files that exist
    (``missing/../lib.attn`` was "looked for" as ``lib.attn``)."""
    (tmp_path / "variants").mkdir()
    main = tmp_path / "variants" / "main.attn"
    main.write_text('import "./../common/nope.attn";\nvariant v { }\n')
    with pytest.raises(AttnError) as raised:
        _window(str(main))
    assert f"(looked for {tmp_path}/variants/../common/nope.attn)" in str(raised.value)


def test_a_link_swapped_after_the_check_is_not_read(tmp_path: Path, monkeypatch) -> None:
    """Quoting was decided on the path's real name after its bytes were read through the
    path: a link swapped in between (a password file read, a `.attn` file named) got the
    secret quoted. The real file is read, without following a link at its name."""
    from attnc.compiler import imports

    (tmp_path / "id_rsa").write_text("password = hunter2 ;\n")
    (tmp_path / "decoy.attn").write_text("def ok() = 1;\n")
    (tmp_path / "pw.attn").symlink_to(tmp_path / "id_rsa")
    main = tmp_path / "v.attn"
    main.write_text('import "pw.attn";\nvariant a { }\n')
    read_regular_file = imports.read_regular_file

    def read_then_swap(path, *args, **kwargs):  # the attacker swaps the link once read
        read = read_regular_file(path, *args, **kwargs)
        if (tmp_path / "pw.attn").is_symlink():
            (tmp_path / "pw.attn").unlink()
            (tmp_path / "pw.attn").symlink_to(tmp_path / "decoy.attn")
        return read

    monkeypatch.setattr(imports, "read_regular_file", read_then_swap)
    with pytest.raises(AttnError) as raised:
        _window(str(main))
    assert "hunter2" not in str(raised.value)
    assert "it is not valid .attn text (line 1, column 1)" in str(raised.value)


def test_a_file_imported_twice_is_recorded_once() -> None:
    from attnc.compiler.imports import load_modules
    from attnc.dsl.parser import parse_module

    lib = os.path.join(STDLIB, "masks.attn")  # imports nothing
    records: list = []
    load_modules(parse_module(f'import "{lib}";\nimport "{lib}";\n', "<string>"), records)
    assert len(records) == 1


def test_an_import_written_through_a_changed_link_is_not_a_stale_hit(cache: Path) -> None:
    """The record held the normalised path: ``sub/../lib.attn`` was checked as ``lib.attn``,
    so a cached load kept the old file after ``sub`` became a link elsewhere."""
    proj, other = cache / "proj", cache / "other"
    (proj / "sub").mkdir(parents=True)
    (other / "inner").mkdir(parents=True)
    (proj / "lib.attn").write_text("def w() = 4;\n")
    (other / "lib.attn").write_text("def w() = 9;\n")
    main = proj / "main.attn"
    main.write_text('import "sub/../lib.attn";\n' + WINDOW_USER)
    assert attnc.load(str(main)).ir.mask.b.value == 4
    (proj / "sub").rmdir()
    (proj / "sub").symlink_to(other / "inner")  # sub/.. is now other/
    assert attnc.load(str(main)).ir.mask.b.value == 9


def test_a_path_through_a_missing_directory_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "lib.attn").write_text("def w() = 4;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "missing/../lib.attn";\n' + WINDOW_USER)
    with pytest.raises(AttnError, match="import not found: 'missing/../lib.attn'") as raised:
        _window(str(main))
    assert f"(looked for {tmp_path}/missing/../lib.attn)" in str(raised.value)


def test_imports_of_an_import_resolve_from_the_path_it_was_read_through(cache: Path) -> None:
    """A module's own imports resolved from its shown (normalised) name, and the cache
    recorded them so: after ``sub`` became a link elsewhere, ``sub/../lib.attn``'s import of
    ``x.attn`` named another file, and the cached load kept the old one."""
    d, e, t = cache / "d", cache / "e", cache / "t"
    for folder in (d / "sub", e / "s", t):
        folder.mkdir(parents=True)
    (t / "lib.attn").write_text('import "x.attn";\ndef w() = kx();\n')
    for folder, value in ((d, 3), (e, 5)):
        (folder / "lib.attn").symlink_to(t / "lib.attn")
        (folder / "x.attn").write_text(f"def kx() = {value};\n")
    main = d / "root.attn"
    main.write_text('import "sub/../lib.attn";\n' + WINDOW_USER)
    assert attnc.load(str(main)).ir.mask.b.value == 3
    (d / "sub").rmdir()
    (d / "sub").symlink_to(e / "s")  # sub/.. is now e/, whose x.attn says 5
    assert attnc.load(str(main)).ir.mask.b.value == 5


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and every exception reachable from it as a cause or context."""
    found: list[BaseException] = []
    at: BaseException | None = err
    while at is not None and at not in found:
        found.append(at)
        at = at.__cause__ or at.__context__
    return found


@pytest.mark.parametrize("imported", ["pw.attn", "bad.attn"])
def test_an_import_error_that_quotes_nothing_holds_no_error_that_does(
    tmp_path: Path, imported: str
) -> None:
    """A link to a file of another name that does not parse, or bytes that are not UTF-8, are
    an error at the import quoting nothing of the file; it was raised in the handler of the
    error that quotes the file, which stayed reachable as its ``__context__``."""
    (tmp_path / "secret.txt").write_text("SECRET_TOKEN=hunter2\n")
    (tmp_path / "pw.attn").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "bad.attn").write_bytes(b"SECRET_TOKEN=hunter2 \xff\n")
    main = tmp_path / "root.attn"
    main.write_text(f'import "{imported}";\nvariant r {{ }}\n')
    with pytest.raises(AttnError) as raised:
        _window(str(main))
    assert "it is not valid .attn text (line 1, column " in str(raised.value)
    assert _causes(raised.value) == [raised.value]
    assert "hunter2" not in "".join(traceback.format_exception(raised.value))


def _frame_locals(err: BaseException) -> str:
    """The locals of every frame of attnc in the tracebacks of ``err`` and the errors it chains
    to, as ``traceback`` shows them with ``capture_locals`` (the test's own frame left out)."""
    package = os.path.dirname(attnc.__file__)
    shown: list[str] = []
    todo = [traceback.TracebackException.from_exception(err, capture_locals=True)]
    while todo:
        found = todo.pop()
        shown += [repr(f.locals) for f in found.stack if f.filename.startswith(package)]
        todo += [e for e in (found.__cause__, found.__context__) if e is not None]
    return "".join(shown)


@pytest.mark.parametrize("imported", ["pw.attn", "bad.attn", "quoted.attn"])
def test_no_frame_of_an_import_error_holds_the_file(tmp_path: Path, imported: str) -> None:
    """The frames an import error passed through (its own and its chain's) hold neither the
    imported bytes nor their text: a link to a file of another name, bytes that are not
    UTF-8, and an .attn file with a parse error (whose message quotes that line, not the
    first)."""
    (tmp_path / "secret.txt").write_text("SECRET_TOKEN=hunter2\n")
    (tmp_path / "pw.attn").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "bad.attn").write_bytes(b"SECRET_TOKEN=hunter2 \xff\n")
    (tmp_path / "quoted.attn").write_text("def hunter2() = 4;\ndef v() = 1 +;\n")
    main = tmp_path / "root.attn"
    main.write_text(f'import "{imported}";\nvariant r {{ }}\n')
    with pytest.raises(AttnError) as raised:
        _window(str(main))
    assert "hunter2" not in str(raised.value)
    assert "hunter2" not in _frame_locals(raised.value)
