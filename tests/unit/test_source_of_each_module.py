"""A diagnostic made while lowering a module quotes the text that module was parsed from,
not the text most recently parsed under the same name (every inline source is
``<string>``), nor nothing when it is lowered in a thread that did not parse it; the file
name (equal, hashed, encoded and pickled as the plain name) refers to the text, which goes
with the last module, expression or variant that holds it."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import threading
import weakref

import pytest

from attnc.compiler.pipeline import compile_source, lower, parse
from attnc.dsl.errors import SOURCE_FILES_KEPT, SOURCES, AttnError, Loc, SourceName, SourceText
from attnc.dsl.parser import parse_expr
from attnc.runtime.build import ir_json

BAD = "variant first {\n    mask = kv_idx <= q_pos && nosuchname;\n}\n"
OTHER = "# the second text, line one\n# THE SECOND TEXT, LINE TWO\nvariant second {}\n"
# The rendered lines under the error's head: BAD's line 2 and the caret under the name.
QUOTED = ["        mask = kv_idx <= q_pos && nosuchname;", " " * 34 + "^~~~~~~~~~"]
GOOD = (
    "# TEXT ONLY\nvariant good {\n    param t: tensor<f32>[8];\n    score = score + t[kv_idx];\n}\n"
)


def test_lowering_quotes_its_own_module_after_another_text_of_the_same_name():
    first = parse(BAD, "<string>")
    parse(OTHER, "<string>")
    with pytest.raises(AttnError) as caught:
        lower(first)
    assert "nosuchname" in caught.value.message
    assert caught.value.render().splitlines()[1:] == QUOTED


def test_lowering_in_another_thread_quotes_the_module():
    first = parse(BAD, "<string>")
    rendered: list[str] = []

    def lower_here() -> None:
        try:
            lower(first)
        except AttnError as err:
            rendered.append(err.render())

    worker = threading.Thread(target=lower_here)
    worker.start()
    worker.join()
    assert len(rendered) == 1
    assert rendered[0].splitlines()[1:] == QUOTED


def test_a_module_keeps_its_text_past_the_map_and_lets_it_go_with_it():
    module = parse(BAD, "<kept>")
    held = weakref.ref(module.file.source)
    for i in range(SOURCE_FILES_KEPT + 1):
        parse(f"variant v{i} {{}}\n", f"<f{i}>")
    assert SOURCES.line(Loc("<kept>", 2, 1)) is None  # the thread's map let it go
    with pytest.raises(AttnError) as caught:
        lower(module)
    assert caught.value.render().splitlines()[1:] == QUOTED
    del module, caught
    gc.collect()
    assert held() is None


def test_the_name_is_the_plain_name_to_equality_hashing_copies_and_pickles():
    module = parse(BAD, "<string>")
    name = module.file
    assert isinstance(name, SourceName)
    assert name == "<string>" and hash(name) == hash("<string>") and repr(name) == "'<string>'"
    assert Loc(name, 2, 5) == Loc("<string>", 2, 5)
    assert hash(Loc(name, 2, 5)) == hash(Loc("<string>", 2, 5))
    assert copy.copy(name) is name and copy.deepcopy(name) is name
    unpickled = pickle.loads(pickle.dumps(Loc(name, 2, 5)))
    assert type(unpickled.file) is str and unpickled == Loc("<string>", 2, 5)
    commented = parse("# TEXT ONLY\nvariant v {}\n", "<string>")
    assert b"TEXT ONLY" not in pickle.dumps(commented)


def test_compiled_ir_encodes_and_pickles_as_if_named_by_a_plain_string():
    """A cache entry and a pickle of compiled IR hold no text and no trace of the name's
    type: the same bytes as IR whose names are plain strings."""
    compiled, warnings = compile_source(GOOD, "<string>")
    assert isinstance(compiled[0].variant.file, SourceName)
    encoded = json.dumps(ir_json.encode((compiled, warnings)), sort_keys=True)
    assert "SourceName" not in encoded and "TEXT ONLY" not in encoded
    decoded = ir_json.decode(json.loads(encoded))
    assert type(decoded[0][0].variant.file) is str
    assert json.dumps(ir_json.encode(decoded), sort_keys=True) == encoded
    assert pickle.loads(pickle.dumps(compiled[0].variant)) == compiled[0].variant
    assert b"TEXT ONLY" not in pickle.dumps(compiled[0])


def test_ir_kept_after_its_module_is_gone_keeps_no_text():
    """Caches hold compiled IR (the variant cache's recent entries, the params layout, the
    module registry): its names refer to the text weakly, so the text goes with the module,
    and a location whose text is gone quotes nothing rather than another text of its name."""
    big = "# " + "x" * 100_000 + "\n" + GOOD
    compiled, _ = compile_source(big, "<held>")
    name = compiled[0].variant.file
    assert isinstance(name, SourceName)
    parse(OTHER, "<held>")  # another text under the name takes its place in the thread's map
    gc.collect()
    assert name.source is None
    assert SOURCES.line(Loc(name, 2, 1)) is None
    assert SOURCES.line(Loc("<held>", 2, 1)) == "# THE SECOND TEXT, LINE TWO"


def test_a_line_is_split_at_line_feeds_only():
    text = SourceText("one\r\ntwo\rstill two\n\nlast")
    assert [text.line(n) for n in range(0, 7)] == [
        None,
        "one",
        "two\rstill two",
        "",
        "last",
        None,
        None,
    ]


@pytest.fixture
def compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNC_COMPILE_CACHE", "1")


SERVED = "variant served {\n    param p: i32 = 1;\n    mask = kv_idx <= q_pos;\n}\n"


def test_a_variant_served_from_the_cache_quotes_its_lines(compile_cache):
    """IR the compile cache serves again (the same objects, decoded once) names its file by
    the name it was compiled under, whose text was gone once another text took the map's
    place: its lines quoted nothing. The name refers to the text served with it again, and a
    variant holds its text."""
    import attnc

    first = attnc.load(source=SERVED)
    twice = attnc.load(source=SERVED)
    assert twice.compiled is first.compiled
    assert SOURCES.line(twice.ir.params[0].loc) == "    param p: i32 = 1;"
    del first, twice
    attnc.load(source=OTHER)  # another text under the name takes the map's place
    gc.collect()
    served = attnc.load(source=SERVED)
    for i in range(SOURCE_FILES_KEPT + 1):
        parse(f"variant v{i} {{}}\n", f"<f{i}>")
    assert SOURCES.line(served.ir.params[0].loc) == "    param p: i32 = 1;"
    held = weakref.ref(served.ir.file.source)
    del served
    gc.collect()
    assert held() is None  # dropping the variant frees its text


def test_a_parsed_expression_holds_its_text():
    expr = parse_expr("a +\n    nosuchname", "<string>")
    parse(OTHER, "<string>")
    gc.collect()
    assert SOURCES.line(expr.loc) == "a +"
    assert SOURCES.line(expr.right.loc) == "    nosuchname"


def test_a_variant_decoded_from_the_disk_cache_quotes_its_own_text(compile_cache, monkeypatch):
    """IR decoded from a disk entry (none of this process's decoded entries kept) named its
    file by a plain name, so its lines were quoted from the thread's most recent text of that
    name: another source's. Its own name refers to the served text, which the variant holds."""
    import attnc
    from attnc.runtime.build import variant_cache

    attnc.load(source=SERVED)  # compiled, written to the disk
    monkeypatch.setattr(variant_cache, "_SEEN", {})
    served = attnc.load(source=SERVED)  # decoded from the disk
    assert isinstance(served.ir.file, SourceName) and served.ir.file == "<string>"
    attnc.load(source=OTHER)  # another text under the name takes the map's place
    gc.collect()
    assert SOURCES.line(served.ir.params[0].loc) == "    param p: i32 = 1;"
    held = weakref.ref(served.ir.file.source)
    del served
    gc.collect()
    assert held() is None  # dropping the variant frees its text
