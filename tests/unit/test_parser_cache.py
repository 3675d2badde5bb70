"""The parser kept on disk (attnc/dsl/parser_cache.py): loaded instead of rebuilt, parses as a
fresh build does, and never turns a damaged or unwritable cache into an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from lark import Lark

from attnc.dsl import parser_cache
from attnc.dsl.parser import GRAMMAR_PATH, PARSER_OPTIONS, grammar_parser, parse_module
from attnc.version import PACKAGE_DIR

OPTIONS: dict[str, object] = PARSER_OPTIONS
GRAMMAR = GRAMMAR_PATH.read_text(encoding="utf-8")
STDLIB = sorted((PACKAGE_DIR / "stdlib_variants").glob("*.attn"))


class Builds:
    """A build function that counts its calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> Lark:
        self.count += 1
        return Lark(GRAMMAR, **OPTIONS)  # type: ignore[arg-type]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_second_process_loads_instead_of_building(root: Path) -> None:
    builds = Builds()
    parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    path = parser_cache.parser_file(GRAMMAR, OPTIONS)
    assert path.is_file() and path.parent == root / "parser"
    parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    assert builds.count == 1


def test_key_changes_with_grammar_and_options(root: Path) -> None:
    base = parser_cache.parser_file(GRAMMAR, OPTIONS)
    assert parser_cache.parser_file(GRAMMAR + "\n", OPTIONS) != base
    assert parser_cache.parser_file(GRAMMAR, {**OPTIONS, "propagate_positions": False}) != base


@pytest.mark.parametrize("path", STDLIB, ids=lambda p: p.stem)
def test_loaded_parser_gives_the_same_ast(root: Path, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    fresh = Lark(GRAMMAR, **OPTIONS)  # type: ignore[arg-type]
    parser_cache.cached_parser(GRAMMAR, OPTIONS, Builds())
    loaded = parser_cache.cached_parser(GRAMMAR, OPTIONS, Builds())
    a, b = fresh.parse(text, start="module"), loaded.parse(text, start="module")
    assert a == b
    assert (a.meta.line, a.meta.column, a.meta.end_line) == (
        b.meta.line,
        b.meta.column,
        b.meta.end_line,
    )


def _signed(body: bytes) -> bytes:
    """``body`` under a header of this grammar's key with the right digest, so that what
    the body holds is what gets tested (not the digest)."""
    key = parser_cache._key(GRAMMAR, OPTIONS)
    return parser_cache._header(key, body.decode("utf-8", "surrogateescape")).encode() + body


def _digit_changed(whole: bytes) -> bytes:
    """One table number changed in place, the header kept: such a file loaded and then
    failed inside Lark's parser (TypeError, AttributeError) or parsed wrongly."""
    head, _, body = whole.partition(b"\n")
    assert b'{"t":[1,' in body
    return head + b"\n" + body.replace(b'{"t":[1,', b'{"t":[110,', 1)


DAMAGE = {
    "empty": lambda whole: b"",
    "text": lambda whole: b"not tables at all",
    "truncated": lambda whole: whole[: len(whole) // 2],
    "other-key": lambda whole: (
        parser_cache.FORMAT.encode() + b" " + b"0" * 64 + b"\n" + whole.partition(b"\n")[2]
    ),
    "code": lambda whole: _signed(b"__import__('os').system('touch /tmp/attnc-pwned')"),
    "nan": lambda whole: _signed(b'{"d": [["data", NaN]]}'),
    "untagged": lambda whole: _signed(b'{"data": 1, "memo": 2}'),
    "wrong-shape": lambda whole: _signed(b'{"d": [["data", 1], ["memo", 2]]}'),
    "unhashable-key": lambda whole: _signed(b'{"d": [[[1], 2]]}'),
    "python-literal": lambda whole: _signed(b"{'data': {}, 'memo': {}}"),
    "nested": lambda whole: _signed(b"[" * 100_000 + b"]" * 100_000),
    "nested-tags": lambda whole: _signed(b'{"t":[' * 5_000 + b"]}" * 5_000),
    "oversized": lambda whole: _signed(b"#" * (parser_cache.MAX_BYTES + 10)),
    "not-utf8": lambda whole: _signed(b"\xff\xfe{}"),
    "digit-changed": _digit_changed,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_file_is_rebuilt_and_replaced(root: Path, damage: str) -> None:
    parser_cache.cached_parser(GRAMMAR, OPTIONS, Builds())
    path = parser_cache.parser_file(GRAMMAR, OPTIONS)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    builds = Builds()
    parser = parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    assert builds.count == 1
    assert parser.parse("variant v { mask = kv_idx <= q_pos; }", start="module")
    parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)  # the file was rewritten whole
    assert builds.count == 1
    assert not Path("/tmp/attnc-pwned").exists()


def test_a_directory_in_place_of_the_file_is_replaced(root: Path) -> None:
    """A directory at the file's name was never replaced (a rename cannot replace one): every
    later process built the tables again (0.3 s each)."""
    path = parser_cache.parser_file(GRAMMAR, OPTIONS)
    (path / "inside").mkdir(parents=True)
    builds = Builds()
    parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    assert path.is_file()
    parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    assert builds.count == 1


def test_cache_root_that_is_a_file_still_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(blocker))
    builds = Builds()
    parser = parser_cache.cached_parser(GRAMMAR, OPTIONS, builds)
    assert builds.count == 1 and parser.parse("variant v { }", start="module")
    assert list(tmp_path.iterdir()) == [blocker]


def test_unreadable_file_is_rebuilt(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser_cache.cached_parser(GRAMMAR, OPTIONS, Builds())

    def refuse(path: Path, key: str) -> None:
        raise PermissionError(f"{path}: denied")

    monkeypatch.setattr(parser_cache, "_read_tables", refuse)
    builds = Builds()
    assert parser_cache.cached_parser(GRAMMAR, OPTIONS, builds).parse(
        "variant v { }", start="module"
    )
    assert builds.count == 1


def test_no_temporary_files_left(root: Path) -> None:
    parser_cache.cached_parser(GRAMMAR, OPTIONS, Builds())
    assert [p.name for p in (root / "parser").iterdir()] == [
        parser_cache.parser_file(GRAMMAR, OPTIONS).name
    ]


def test_parse_module_uses_the_cache(root: Path) -> None:
    grammar_parser.cache_clear()
    try:
        module = parse_module("variant v {\n  mask = kv_idx <= q_pos;\n}\n")
        assert module.items[0].name == "v"  # type: ignore[attr-defined]
        assert parser_cache.parser_file(GRAMMAR, OPTIONS).is_file()
    finally:
        grammar_parser.cache_clear()
