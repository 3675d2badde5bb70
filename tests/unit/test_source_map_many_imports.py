"""A compilation importing more files than the source map keeps still quotes every file's
line (each module's locations carry its text; test_source_of_each_module.py checks that the
text goes with the module)."""

from __future__ import annotations

import pytest

from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import SOURCE_FILES_KEPT, AttnError

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
