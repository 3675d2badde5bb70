"""A deeply nested variant read from the compiled-variant cache loads as a compiled one does.

Each load runs in a fresh interpreter: a process that compiled the variant keeps its objects,
so only a later process decodes the entry, with Python's default recursion limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
TERMS = 1200  # a flat sum nests once per term: deeper than Python's default stack allows


def _deep_source(comment: str = "") -> str:
    terms = "".join(f" + {i}.0" for i in range(TERMS))
    return f"# {comment}\nvariant deep {{ score = score{terms}; }}\n"


_LOAD = """
import sys
import attnc
for path in sys.argv[1:]:
    v = attnc.load(path)
    print(v.ir.name, "loaded")
"""

# Prepended to a script that must read every variant from the cache.
_NO_COMPILING = """
from attnc.compiler import pipeline
def refused(text, file):
    raise AssertionError(f"{file} was compiled, not read from the cache")
pipeline.compile_with_imports = refused
"""

_TWO_COPIES = """
import shutil
import sys
import attnc
from attnc.compiler.analysed import analysed
path, other = sys.argv[1:]
a = attnc.load(path)
shutil.copyfile(other, path)  # the same file name, another text: another entry
b = attnc.load(path)
assert a.ir is not b.ir and a.ir == b.ir
assert analysed(b.ir).variant == a.ir
print("equal copies")
"""


def _python(code: str, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ATTNC_CACHE_DIR=str(cache), PYTHONPATH=REPO)
    env.pop("ATTNC_COMPILE_CACHE", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cache.parent,
        env=env,
        timeout=300,
    )


def test_deep_variant_loads_again_from_the_cache(tmp_path):
    source = tmp_path / "deep.attn"
    source.write_text(_deep_source())
    cache = tmp_path / "cache"
    for script in (_LOAD, _NO_COMPILING + _LOAD):  # compiles and writes the entry, reads it
        done = _python(script, cache, str(source))
        assert done.returncode == 0, done.stderr
        assert done.stdout == "deep loaded\n"


def test_two_cached_copies_of_a_deep_variant_compare_equal(tmp_path):
    """Two entries of one file name (the texts differ in a comment) decode to separate but
    equal IR, which the analyses' memo compares node by node, once per nesting level."""
    path, other = tmp_path / "deep.attn", tmp_path / "other.txt"
    cache = tmp_path / "cache"
    for comment in ("b", "a"):  # compile both texts into the cache
        path.write_text(_deep_source(comment))
        assert _python(_LOAD, cache, str(path)).returncode == 0
    other.write_text(_deep_source("b"))
    done = _python(_NO_COMPILING + _TWO_COPIES, cache, str(path), str(other))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "equal copies\n"


def test_same_code_of_two_deep_copies_compares_with_recursion_room() -> None:
    """``VariantIR.same_code`` (the compiled prefill op's check of a variant against its
    module's IR) compared two separately built deep copies without the passes' room."""
    from attnc.compiler.pipeline import compile_source

    terms = "".join(f" + {i}.0" for i in range(1900))  # optimised: about 630 levels
    source = f"variant deep_same {{ score = score{terms}; }}"
    first = compile_source(source, "a.attn")[0][0].variant
    second = compile_source(source, "b.attn")[0][0].variant
    assert first is not second and first.same_code(second)


_CORRUPT_DEEP_ENTRY = """
import sys, threading
from attnc.runtime.build import variant_cache
text = "variant v { score = score * 2.0; }\\n"
key = variant_cache.entry_key(text, "<string>")
path = variant_cache._entry_path(key)
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text("[" * 24000 + "]" * 24000)
def load():
    print(variant_cache.compile_cached(text, "<string>")[0][0].variant.name, flush=True)
from attnc.dsl.limits import deep_recursion
deep = deep_recursion()
deep.__enter__()  # as another thread's compile raises the process's limit meanwhile
threading.stack_size(1 << 20)
thread = threading.Thread(target=load)
thread.start()
thread.join()
"""


def test_a_corrupt_entry_nested_deeply_is_a_miss_not_a_crash(tmp_path):
    """The entry's JSON was parsed with the passes' recursion room: 24000 nested brackets
    overflowed a 1 MiB thread stack (SIGSEGV) where a RecursionError is a miss."""
    done = _python(_CORRUPT_DEEP_ENTRY, tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "v\n"


_CACHED_LOAD_IMPORTS = """
import sys
import attnc
attnc.load("stdlib:alibi")
print(sorted(m for m in ("lark", "sympy") if m in sys.modules))
"""


def test_a_cached_load_imports_neither_lark_nor_sympy(tmp_path):
    """The cache's check of its imports imported the import resolver, and with it the
    parser and Lark (about 90 ms of a 130 ms cached load)."""
    cache = tmp_path / "cache"
    assert _python(_CACHED_LOAD_IMPORTS, cache).returncode == 0  # fills the cache
    done = _python(_CACHED_LOAD_IMPORTS, cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_entry_nesting_is_measured_on_ascii_text_only():
    """``json.loads`` reads UTF-16 bytes too, where the byte-wise string skipping took an
    escaped quote's ``\\`` + NUL for an escape and measured a deep entry as 1 deep."""
    from attnc.runtime.build.variant_cache import MAX_ENTRY_NESTING, json_nesting

    text = '["a\\"b",' + "[" * 5000 + "]" * 5000 + ',"c"]'
    assert json_nesting(text.encode()) == MAX_ENTRY_NESTING + 1  # counted no further
    assert json_nesting(text.encode("utf-16-le")) > MAX_ENTRY_NESTING
    assert json_nesting(b'{"k":["]\\\\\\\\",{"x":"[{"}]}') == 3  # brackets in strings skipped


def test_an_unterminated_string_is_measured_in_one_pass():
    """A string pattern that backtracks tried every escaped quote after an unterminated one
    as a new string start (quadratic: 200000 of them would take hours)."""
    from attnc.runtime.build.variant_cache import MAX_ENTRY_NESTING, json_nesting

    assert json_nesting(b'["' + b'\\"' * 200_000) > MAX_ENTRY_NESTING
