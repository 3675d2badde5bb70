"""Quoting a line of a long text: each quote scanned the text from its start to the line, so
a compile's cost grew with its diagnostics times their line numbers (1000 warnings past
400000 blank lines: 47 s). The offsets where lines start are found once per text."""

from __future__ import annotations

import time

from attnc.compiler.pipeline import compile_source
from attnc.dsl import errors
from attnc.dsl.errors import SourceText

BLANK_LINES = 20_000
PARAMS = 200


def _many_warnings() -> str:
    params = "".join(f"    param p{i}: i32 = 1;\n" for i in range(PARAMS))
    return "\n" * BLANK_LINES + "variant v {\n" + params + "    mask = kv_idx <= q_pos;\n}\n"


def test_a_compile_finds_the_line_starts_of_its_text_once(monkeypatch) -> None:
    scanned: list[int] = []
    find = errors.line_starts

    def counted(text: str):
        scanned.append(len(text))
        return find(text)

    monkeypatch.setattr(errors, "line_starts", counted)
    text = _many_warnings()
    _, warnings = compile_source(text, "<many warnings>")
    assert len(warnings) == PARAMS
    assert [w.source_line for w in warnings] == [f"    param p{i}: i32 = 1;" for i in range(PARAMS)]
    assert scanned == [len(text)]


def test_quoting_late_lines_of_a_long_text_takes_no_scan_per_quote() -> None:
    text = SourceText("\n" * 100_000 + "".join(f"line {i}\r\n" for i in range(1000)))
    began = time.perf_counter()
    quoted = [text.line(100_001 + i) for i in range(1000)]
    took = time.perf_counter() - began
    assert quoted == [f"line {i}" for i in range(1000)]
    assert took < 2.0  # milliseconds now; about ten seconds with a scan per quote


def test_line_starts_are_the_offsets_after_each_line_feed() -> None:
    assert list(errors.line_starts("")) == [0]
    assert list(errors.line_starts("a\r\nbc\n\nd")) == [0, 3, 6, 7]
    text = SourceText("a\r\nbc\n\nd\n")
    assert [text.line(n) for n in range(7)] == [None, "a", "bc", "", "d", "", None]


def test_line_starts_take_four_bytes_a_line(monkeypatch) -> None:
    """The offsets of a text of at most 2**32 - 1 characters (every file read: 16 MiB at most)
    take 4 bytes a line (they took 8); a longer text's take 8."""
    starts = errors.line_starts("a\n" * 1000)
    assert starts.itemsize == 4 and starts.typecode == "I" and starts[-1] == 2000
    monkeypatch.setattr(errors, "U32_OFFSETS", 3)
    wide = errors.line_starts("ab\ncd\n")
    assert wide.typecode == "q" and list(wide) == [0, 3, 6]
    assert errors.line_starts("ab\n").typecode == "I"
