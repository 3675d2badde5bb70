"""Diagnostics quote their own source line while another thread loads other inline source
under the same name (``<string>``), and the compiled-variant cache keeps the right line.

The other thread's load is forced between this thread's parse and its diagnostics: the shared
parser is wrapped so that, when this thread asks for it, another thread parses OTHER first.
"""

from __future__ import annotations

import threading

import pytest

import attnc
from attnc.compiler.pipeline import compile_source
from attnc.dsl import parser
from attnc.dsl.errors import SOURCES, AttnError, Loc
from attnc.runtime.build import variant_cache

OTHER = "\n\n\n   # OTHER THREAD'S LINE FOUR\nvariant good { mask = kv_idx <= q_pos; }\n"
BAD = (
    "variant bad {\n    param cap: f32 = 50.0;\n    score = cap * tanh(score / cap);\n"
    "    mask = kv_idx <= q_pos && nosuchname;\n}\n"
)
WARN = (
    "variant warned_by_index {\n    param t: tensor<f32>[8];\n    mask = kv_idx <= q_pos;\n"
    "    score = score + t[kv_idx];\n}\n"
)


def _in_other_thread(fn) -> None:
    """Run ``fn`` in a new thread and wait for it."""
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


@pytest.fixture
def interleaved(monkeypatch):
    """Another thread parses OTHER as ``<string>`` while this thread is mid-compile."""
    real = parser.grammar_parser
    me = threading.get_ident()

    def parser_after_other_load(strict: bool = False):
        if threading.get_ident() == me:
            _in_other_thread(lambda: parser.parse_module(OTHER))
        return real(strict)

    monkeypatch.setattr(parser, "grammar_parser", parser_after_other_load)


def test_error_quotes_its_own_line(interleaved):
    with pytest.raises(AttnError) as caught:
        compile_source(BAD, "<string>")
    text = str(caught.value)
    assert "nosuchname" in caught.value.message
    assert "mask = kv_idx <= q_pos && nosuchname;" in text
    assert "OTHER THREAD" not in text


def test_warning_quotes_its_own_line(interleaved):
    _, warnings = compile_source(WARN, "<string>")
    assert warnings
    assert all(w.source_line == "    score = score + t[kv_idx];" for w in warnings)


def test_cached_warning_keeps_its_own_line(interleaved, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)
    attnc.load(source=WARN)
    monkeypatch.setattr(variant_cache, "_SEEN", {})  # as a later process: decode the entry
    found: list[str] = []
    _in_other_thread(lambda: found.extend(w.render() for w in attnc.load(source=WARN).warnings))
    assert found and all("score = score + t[kv_idx];" in r for r in found)
    assert not any("OTHER THREAD" in r for r in found)


def test_a_thread_quotes_only_text_it_loaded():
    parser.parse_module("variant mine { mask = kv_idx <= q_pos; }\n", "<own-thread>")
    seen: list[str | None] = []
    _in_other_thread(lambda: seen.append(SOURCES.line(Loc("<own-thread>", 1, 1))))
    assert seen == [None]
    assert SOURCES.line(Loc("<own-thread>", 1, 1)) == "variant mine { mask = kv_idx <= q_pos; }"


def test_a_thread_keeps_the_text_of_its_latest_files_only() -> None:
    """Every file ever loaded kept its text for the process's life (2.5 KB a file); the map
    now keeps the most recent SOURCE_FILES_KEPT, and one added again is the most recent."""
    from attnc.dsl.errors import SOURCE_FILES_KEPT, Loc, SourceMap

    sources = SourceMap()
    sources.add("first.attn", "kept\n")
    for i in range(SOURCE_FILES_KEPT + 10):
        sources.add(f"f{i}.attn", f"line {i}\n")
        sources.add("first.attn", "kept\n")  # used again: not the oldest
    assert sources.line(Loc("first.attn", 1, 1)) == "kept"
    assert sources.line(Loc("f0.attn", 1, 1)) is None
    assert (
        sources.line(Loc(f"f{SOURCE_FILES_KEPT + 9}.attn", 1, 1)) == f"line {SOURCE_FILES_KEPT + 9}"
    )
    assert len(sources._recent()) == SOURCE_FILES_KEPT
