"""A compilation importing more files than the source map keeps still quotes every file's
line, and the text of files no module holds any more is still let go."""

from __future__ import annotations

import gc

import pytest

from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import SOURCE_FILES_KEPT, AttnError, Loc, SourceMap

IMPORTS = SOURCE_FILES_KEPT + 1  # the root file, parsed first, is the oldest of them all


def test_an_error_in_the_root_file_after_many_imports_quotes_its_line(tmp_path):
    for i in range(IMPORTS):
        (tmp_path / f"f{i}.attn").write_text(f"def d{i}() = {i};\n")
    imports = "".join(f'import "f{i}.attn";\n' for i in range(IMPORTS))
    root = tmp_path / "main.attn"
    text = imports + "variant v { mask = undefined_name; }\n"
    root.write_text(text)
    with pytest.raises(AttnError) as err:
        compile_source(text, str(root))
    assert err.value.loc.line == IMPORTS + 1
    assert err.value.render().splitlines()[1:] == [
        "    variant v { mask = undefined_name; }",
        "                       ^~~~~~~~~~~~~~",
    ]


class _Owner:
    """Stands for a parsed module."""


def test_a_tied_file_outlives_eviction_until_its_owner_goes() -> None:
    sources = SourceMap()
    sources.add("root.attn", "root line\n")
    owner = _Owner()
    sources.tie("root.attn", owner)
    for i in range(SOURCE_FILES_KEPT + 1):
        sources.add(f"f{i}.attn", f"line {i}\n")
    assert sources.line(Loc("root.attn", 1, 1)) == "root line"
    del owner
    gc.collect()
    assert sources.line(Loc("root.attn", 1, 1)) is None
    assert sources.line(Loc("f0.attn", 1, 1)) is None  # evicted, never tied
    assert len(sources._texts()) == SOURCE_FILES_KEPT
