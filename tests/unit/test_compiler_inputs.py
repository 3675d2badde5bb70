"""Hostile inputs to the front and middle end give located errors that quote nothing they
should not, and the compiler's modules import each other one way only."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import attnc.compiler
from attnc.compiler.pipeline import compile_source, resolve_source
from attnc.dsl.errors import AttnError

SECRET = "root:x:0:0:SECRET-LINE:/root:/bin/bash\n"


def test_import_of_a_non_attn_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_text(SECRET)
    spec = tmp_path / "v.attn"
    spec.write_text(f'import "{secret}";\nvariant v {{ score = score; }}\n')
    with pytest.raises(AttnError) as err:
        compile_source(*resolve_source(str(spec)))
    text = str(err.value)
    assert "SECRET" not in text and "root:x" not in text
    assert text.startswith(f"{spec}:1:1: error: cannot import '{secret}': only .attn files")


def test_import_of_an_attn_file_that_does_not_parse_quotes_none_of_it(tmp_path: Path) -> None:
    (tmp_path / "pw.attn").symlink_to(tmp_path / "passwd")
    (tmp_path / "passwd").write_text(SECRET)
    spec = tmp_path / "v.attn"
    spec.write_text('import "pw.attn";\nvariant v { score = score; }\n')
    with pytest.raises(AttnError) as err:
        compile_source(*resolve_source(str(spec)))
    text = str(err.value)
    assert "SECRET" not in text and "root:x" not in text
    assert text.splitlines()[0] == (
        f"{spec}:1:1: error: cannot import 'pw.attn': it is not valid .attn text (line 1, column 1)"
    )


def test_import_of_binary_attn_file(tmp_path: Path) -> None:
    (tmp_path / "b.attn").write_bytes(b"\xff\xfe\x00SECRET")
    spec = tmp_path / "v.attn"
    spec.write_text('import "b.attn";\nvariant v { score = score; }\n')
    with pytest.raises(AttnError) as err:
        compile_source(*resolve_source(str(spec)))
    assert "SECRET" not in str(err.value)
    assert "cannot import 'b.attn': it is not valid .attn text (line 1, column 1)" in str(err.value)


def test_invalid_utf8_is_a_located_error(tmp_path: Path) -> None:
    spec = tmp_path / "u.attn"
    spec.write_bytes(b'variant u {\n  doc "ok \xc3\xa9 \xff";\n}\n')
    with pytest.raises(AttnError) as err:
        resolve_source(str(spec))
    assert err.value.loc.line == 2 and err.value.loc.col == 13
    assert str(err.value).splitlines()[0] == (
        f"{spec}:2:13: error: invalid UTF-8 (byte 0xff): .attn files are UTF-8 text"
    )


@pytest.mark.parametrize("name", ["nope", "\x1b[31mred", "../cli", "/etc/passwd", "a/../causal"])
def test_stdlib_names_are_plain_file_names_and_echoed_escaped(tmp_path: Path, name: str) -> None:
    (tmp_path / "abs.attn").write_text("variant abs { score = score; }\n")
    for spec in (f"stdlib:{name}", f"stdlib:{tmp_path / 'abs'}"):
        with pytest.raises(FileNotFoundError) as err:
            resolve_source(spec)
        text = str(err.value)
        assert text.startswith("no stdlib variant ") and "available: alibi" in text
        assert "\x1b" not in text


def _imports(path: Path) -> set[str]:
    """Modules of attnc.compiler that ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("attnc.compiler."):
                found.add(node.module.split(".")[2])
            elif node.module == "attnc.compiler":
                found.update(a.name for a in node.names)
    return found


def test_compiler_imports_have_no_cycle() -> None:
    folder = Path(os.path.dirname(attnc.compiler.__file__))
    graph = {p.stem: _imports(p) for p in folder.glob("*.py")}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        assert state.get(name) != 1, f"import cycle: {' -> '.join(path + [name])}"
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            visit(dep, path + [name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])
    assert "pipeline" not in graph["results"]


@pytest.mark.parametrize("spec", ["variant-a.attn", "models/variant/x.attn", "my variant.attn"])
def test_a_missing_path_with_the_word_variant_is_a_missing_file(spec: str) -> None:
    """'attnc build variant-a.attn' (no such file) was parsed as source: '<string>:1:8:
    error: expected a name, found '-''."""
    with pytest.raises(FileNotFoundError):
        resolve_source(spec)


def test_one_line_source_is_still_source() -> None:
    text, name = resolve_source("variant v { mask = kv_idx <= q_pos; }")
    assert name == "<string>" and text.startswith("variant v")
