"""The compiled-variant disk cache: hits skip the compiler, edits of imports invalidate,
broken entries are ignored, and the switch turns it off."""

from __future__ import annotations

import pytest

import attnc
from attnc.compiler import pipeline
from attnc.runtime.build import variant_cache

SOURCE = """variant cached_probe {
    doc "probe";
    param cap: f32 = 30.0;
    param unused: i32 = 1;
    score = cap * tanh(score / cap);
    mask = kv_idx <= q_pos;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)
    calls = []
    real = pipeline.compile_with_imports

    def counting(text, file):
        calls.append(file)
        return real(text, file)

    monkeypatch.setattr(pipeline, "compile_with_imports", counting)
    return tmp_path, calls


def test_second_load_is_a_hit_with_the_same_result(cache):
    _, calls = cache
    a = attnc.load(SOURCE)
    b = attnc.load(SOURCE)
    assert len(calls) == 1
    assert b.ir == a.ir and b.compiled == a.compiled
    assert [w.message for w in b.warnings] == [w.message for w in a.warnings]
    assert any("unused" in w.message for w in b.warnings)


def test_edited_import_invalidates(cache, tmp_path):
    _, calls = cache
    (tmp_path / "defs.attn").write_text("def near() = kv_idx <= q_pos;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "defs.attn";\nvariant v {\n    mask = near();\n}\n')
    attnc.load(str(main))
    attnc.load(str(main))
    assert len(calls) == 1
    (tmp_path / "defs.attn").write_text("def near() = kv_idx + 8 <= q_pos;\n")
    v = attnc.load(str(main))
    assert len(calls) == 2
    assert "8" in v.ir.mask.__repr__()


def test_broken_entry_is_recompiled(cache):
    root, calls = cache
    attnc.load(SOURCE)
    (entry,) = (root / "compiled").iterdir()
    entry.write_bytes(b"not a pickle")
    attnc.load(SOURCE)
    assert len(calls) == 2
    attnc.load(SOURCE)
    assert len(calls) == 2  # rewritten by the recompile


def test_a_directory_in_place_of_an_entry_is_replaced(cache):
    """A directory at an entry's name was never replaced: every load compiled again."""
    root, calls = cache
    attnc.load(SOURCE)
    (entry,) = (root / "compiled").iterdir()
    entry.unlink()
    (entry / "inside").mkdir(parents=True)
    attnc.load(SOURCE)
    assert len(calls) == 2 and entry.is_file()
    attnc.load(SOURCE)
    assert len(calls) == 2


def test_switch_off(cache, monkeypatch):
    root, calls = cache
    monkeypatch.setenv("ATTNC_COMPILE_CACHE", "0")
    attnc.load(SOURCE)
    attnc.load(SOURCE)
    assert len(calls) == 2
    assert not (root / "compiled").exists()


def test_errors_are_not_cached(cache):
    _, calls = cache
    bad = SOURCE.replace("score / cap", "score / nope")
    for _ in range(2):
        with pytest.raises(attnc.AttnError, match="nope"):
            attnc.load(bad)
    assert len(calls) == 2


def test_fingerprint_is_stable():
    assert variant_cache.compiler_fingerprint() == variant_cache.compiler_fingerprint()
    assert len(variant_cache.compiler_fingerprint()) == 64


def test_an_import_edited_during_the_compile_is_not_cached_as_compiled(
    cache, tmp_path, monkeypatch
):
    """The entry recorded the import's digest after compiling: an edit saved while the
    compiler ran was cached as if compiled, and later loads kept the old mask."""
    _, calls = cache
    defs = tmp_path / "defs.attn"
    defs.write_text("def near() = kv_idx <= q_pos;\n")
    main = tmp_path / "main.attn"
    main.write_text('import "defs.attn";\nvariant v {\n    mask = near();\n}\n')
    real_lower = pipeline.lower_modules

    def lower_then_edit(modules):
        defs.write_text("def near() = kv_idx + 8 <= q_pos;\n")  # saved while compiling
        return real_lower(modules)

    monkeypatch.setattr(pipeline, "lower_modules", lower_then_edit)
    first = attnc.load(str(main))
    assert "8" not in repr(first.ir.mask)
    monkeypatch.setattr(pipeline, "lower_modules", real_lower)
    later = attnc.load(str(main))
    assert len(calls) == 2
    assert "8" in repr(later.ir.mask)
