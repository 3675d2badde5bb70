"""One file reached through two hard links (as through two bind mounts: the same device and
inode) is one module, as one reached through a symbolic link is: it was loaded twice, a
duplicate definition. The compiled-variant cache misses when which imports are one module
changes (a link replaced by a copy, copies replaced by links)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import attnc
from attnc.compiler.pipeline import compile_with_imports
from attnc.dsl.errors import AttnError

WINDOW_USER = "variant v { mask = q_pos - kv_idx < w(); }\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)
    return tmp_path


def _main(folder: Path, *imports: str, body: str = WINDOW_USER) -> Path:
    main = folder / "main.attn"
    main.write_text("".join(f'import "{i}";\n' for i in imports) + body)
    return main


def test_a_file_imported_through_two_hard_links_is_loaded_once(tmp_path: Path) -> None:
    (tmp_path / "a.attn").write_text("def w() = 4;\n")
    os.link(tmp_path / "a.attn", tmp_path / "b.attn")
    main = _main(tmp_path, "a.attn", "b.attn")
    compiled, _, records = compile_with_imports(main.read_text(), str(main))
    assert compiled[0].variant.mask.b.value == 4
    module = str(tmp_path.resolve() / "a.attn")
    assert [(os.path.basename(p), m) for p, m, _ in records] == [
        ("a.attn", module),
        ("b.attn", module),
    ]


def test_a_hard_link_to_the_importing_file_is_a_cycle(tmp_path: Path) -> None:
    main = _main(tmp_path, "again.attn")
    os.link(main, tmp_path / "again.attn")
    with pytest.raises(AttnError, match=r"cyclic import of 'again.attn' \(main.attn -> again"):
        compile_with_imports(main.read_text(), str(main))


def test_a_hard_link_replaced_by_a_copy_is_not_a_stale_hit(cache: Path) -> None:
    (cache / "a.attn").write_text("def w() = 4;\n")
    os.link(cache / "a.attn", cache / "b.attn")
    main = _main(cache, "a.attn", "b.attn")
    assert attnc.load(str(main)).ir.mask.b.value == 4
    (cache / "b.attn").unlink()
    (cache / "b.attn").write_text("def w() = 4;\n")  # the same bytes, another file
    with pytest.raises(AttnError, match="duplicate def 'w'"):
        attnc.load(str(main))


def test_copies_made_one_file_are_not_a_stale_hit(cache: Path) -> None:
    """Two copies of a file importing ``lib.attn`` from their own folders were two modules;
    once one is a hard link of the other they are one, whose import reads one folder only."""
    for folder, lib in (("d1", "def w() = 4;\n"), ("d2", "def u() = 5;\n")):
        (cache / folder).mkdir()
        (cache / folder / "x.attn").write_text('import "lib.attn";\n')
        (cache / folder / "lib.attn").write_text(lib)
    body = "variant v { mask = q_pos - kv_idx < w() + u(); }\n"
    main = _main(cache, "d1/x.attn", "d2/x.attn", body=body)
    attnc.load(str(main))
    (cache / "d2" / "x.attn").unlink()
    os.link(cache / "d1" / "x.attn", cache / "d2" / "x.attn")
    with pytest.raises(AttnError, match="unknown function 'u'"):
        attnc.load(str(main))
