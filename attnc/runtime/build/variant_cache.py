"""Owns: the disk cache of compiled variants, so loading a variant compiled before skips the
parser and SymPy (a cached ``attnc.load`` takes milliseconds instead of about a second).

An entry is keyed by the source text, its file name, the directory its imports resolve
from (the file's own directory, or the working directory for inline source) and a
fingerprint of the compiler (the sources of ``attnc.dsl``, ``attnc.compiler`` and the
grammar). It records every import statement the source met, transitively (one skipped as
already loaded under another spelling too): the path, the module it named (the real path of
the file the module was read from) and the sha256 of the module's bytes; it is used only
while each path still names a file with that content, one file for the statements of one
module and different files for different modules (a link replaced by a copy, or a copy by a
link, is a miss).

Entries are data, never code: JSON holding a format version, the key, and the compiled
variants and warnings encoded by :mod:`attnc.runtime.build.ir_json`, under a sha256 digest of
that payload. Anything else (another format, a digest mismatch, a key mismatch, a payload that
does not decode to well-typed compiled variants) is ignored and rewritten. Entries live in
``$ATTNC_CACHE_DIR/compiled`` and are written atomically. ``ATTNC_COMPILE_CACHE=0`` turns the
cache off.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from attnc.compiler.import_paths import ImportRecord, import_dir, real_path, same_modules
from attnc.compiler.results import Compiled, remember
from attnc.compiler.verify import verify_variant
from attnc.dsl.errors import SOURCES, Diagnostic, SourceName, SourceText, printable
from attnc.dsl.limits import MAX_SOURCE_BYTES, deep_recursion
from attnc.regular_file import read_regular, write_atomically
from attnc.runtime.build import ir_json
from attnc.runtime.build.cache import cache_dir
from attnc.verbose import env_flag, verbose
from attnc.version import PACKAGE_DIR

FORMAT = 4  # bump when the entry layout changes (4: imports as path, module, sha256)
MAGIC = "attnc-compiled-variants"
MAX_ENTRY_BYTES = 64 << 20


def enabled() -> bool:
    """False when ``ATTNC_COMPILE_CACHE`` is off (:func:`attnc.verbose.env_flag`; on when
    unset)."""
    return env_flag("ATTNC_COMPILE_CACHE", default=True)


@lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """sha256 over the front and middle end's sources (any change invalidates entries)."""
    root = PACKAGE_DIR
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for sub in ("dsl", "compiler"):
        for path in sorted((root / sub).rglob("*")):
            if path.suffix in (".py", ".lark") and path.is_file():
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def _file_digest(path: str) -> str | None:
    """The sha256 of an imported source now; None when it is not a readable source file."""
    try:
        data = read_regular(path, MAX_SOURCE_BYTES)
    except (OSError, ValueError):
        return None
    return None if len(data) > MAX_SOURCE_BYTES else hashlib.sha256(data).hexdigest()


def import_base(file: str) -> str:
    """The real path of the directory relative imports of ``file`` resolve from
    (:func:`attnc.compiler.import_paths.import_dir`)."""
    return real_path(import_dir(file))


def entry_key(text: str, file: str) -> str:
    """sha256 of everything that decides what ``text`` compiles to, besides its imports'
    contents (those are checked against the entry's recorded digests)."""
    h = hashlib.sha256(compiler_fingerprint().encode())
    for part in (file, import_base(file), text):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def _entry_path(key: str) -> Path:
    return cache_dir() / "compiled" / f"{key}.json"


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


_Decoded = tuple[tuple[ImportRecord, ...], tuple[Compiled, ...], tuple[Diagnostic, ...]]


def _decode_entry(data: Any, key: str, name: SourceName | None = None) -> _Decoded:
    if not isinstance(data, dict) or set(data) != {"magic", "format", "digest", "payload"}:
        raise ir_json.DecodeError("not an entry")
    if data["magic"] != MAGIC or data["format"] != FORMAT:
        raise ir_json.DecodeError("another format")
    payload = data["payload"]
    if not isinstance(payload, dict) or data["digest"] != _digest(payload):
        raise ir_json.DecodeError("digest mismatch")
    if payload.get("key") != key:
        raise ir_json.DecodeError("entry of another key")
    files = {} if name is None else {str(name): name}
    imports, compiled, warnings = ir_json.decode(payload.get("body"), files)
    ok_imports = all(
        isinstance(i, tuple) and len(i) == 3 and all(isinstance(s, str) for s in i) for i in imports
    )
    if not ok_imports or not all(isinstance(c, Compiled) for c in compiled):
        raise ir_json.DecodeError("not compiled variants")
    if not all(isinstance(w, Diagnostic) for w in warnings):
        raise ir_json.DecodeError("not diagnostics")
    for c in compiled:  # well-typed IR only, as the pipeline itself checks
        verify_variant(c.lowered, "loading from the cache")
        verify_variant(c.variant, "loading from the cache")
    return imports, compiled, warnings


# Entries this process decoded or wrote, by the sha256 of their bytes: loading one again
# returns the same objects, so the shared nodes of two equal IR DAGs are never compared
# structurally (which costs their unfolded trees).
_SEEN: dict[tuple[str, str], _Decoded] = {}  # the most recently used last
_SEEN_ENTRIES = 64  # entries kept: a process loading many distinct sources keeps only these


def _seen(key: tuple[str, str], decoded: _Decoded) -> None:
    """Keep ``decoded`` as the most recently used entry, dropping the oldest beyond the limit
    (several threads may do this at once: a missing oldest key is skipped)."""
    _SEEN.pop(key, None)
    _SEEN[key] = decoded
    while len(_SEEN) > _SEEN_ENTRIES:
        try:
            _SEEN.pop(next(iter(_SEEN)), None)
        except (StopIteration, RuntimeError):  # emptied or changed by another thread
            break


# Entries nest about 9 levels (entry, payload, body, node table, node, fields); more is corrupt.
MAX_ENTRY_NESTING = 32
# A JSON string (escapes unrolled: no backtracking between its alternatives), a run of text
# outside strings and brackets, or any one byte (a bracket; a quote whose string never ends).
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[^"\[\]{}]+|.', re.S)


def json_nesting(raw: bytes) -> int:
    """How deeply the arrays and objects of the ASCII JSON text ``raw`` nest (strings
    skipped), counted no further than past :data:`MAX_ENTRY_NESTING`, in one pass. Bytes
    that are not ASCII text without NULs (entries are written so; ``json.loads`` would read
    UTF-16 or UTF-32, whose escapes this does not skip), or a string that never ends, count
    as nested too deeply."""
    if not raw.isascii() or b"\0" in raw:
        return MAX_ENTRY_NESTING + 1
    depth = deepest = 0
    for token in _JSON_TOKEN.finditer(raw):
        first = raw[token.start()]
        if first in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_ENTRY_NESTING:
                break
        elif first in b"]}":
            depth -= 1
        elif first == ord('"') and token.end() - token.start() == 1:
            return MAX_ENTRY_NESTING + 1  # an unterminated string: not an entry
    return deepest


def _decoded(raw: bytes, key: str, name: SourceName | None = None) -> _Decoded:
    """The entry ``raw`` of ``key`` decoded and checked (its IR naming its own file ``name``:
    :func:`read_entry`), with the recursion room the compiler's
    passes have (its IR may nest as deeply as they allow). The JSON is parsed with Python's
    default limit: an entry is a flat table of nodes, and a corrupt one nested thousands of
    levels deep must be a miss, not a crash of a thread's stack (the recursion limit is the
    process's: another thread's compile may have raised it), so one nested deeper than an
    entry ever is is not parsed."""
    if json_nesting(raw) > MAX_ENTRY_NESTING:
        raise ir_json.DecodeError("nested deeper than an entry")
    data = json.loads(raw)
    with deep_recursion():
        return _decode_entry(data, key, name)


def read_entry(
    path: Path, key: str, name: SourceName | None = None
) -> tuple[tuple[Compiled, ...], tuple[Diagnostic, ...]] | None:
    """The compiled variants and warnings of the entry at ``path``, or None when it is
    missing, not a valid entry of ``key``, or an import it recorded has changed. Decoded IR
    names the entry's own file ``name`` (given: a :class:`SourceName` referring to the text
    served, the one the key was made of), so its locations quote that text; the files it
    imported keep plain names."""
    try:
        raw = read_regular(path, MAX_ENTRY_BYTES)
        if len(raw) > MAX_ENTRY_BYTES:
            return None
        seen = (key, hashlib.sha256(raw).hexdigest())
        decoded = _SEEN.get(seen) or _decoded(raw, key, name)
    except Exception:  # any unreadable or invalid entry is a miss; it gets rewritten
        return None
    imports, compiled, warnings = decoded
    if not same_modules(imports) or any(_file_digest(p) != d for p, _, d in imports):
        return None
    _seen(seen, decoded)
    return compiled, warnings


def write_entry(
    path: Path,
    key: str,
    imports: tuple[ImportRecord, ...],
    compiled: tuple[Compiled, ...],
    warnings: tuple[Diagnostic, ...],
) -> None:
    """Write an entry atomically (a temporary file renamed over ``path``); errors only cost
    speed, so a read-only or full cache is silently skipped."""
    try:
        payload = {"key": key, "body": ir_json.encode((imports, compiled, warnings))}
        entry = {"magic": MAGIC, "format": FORMAT, "digest": _digest(payload), "payload": payload}
        text = json.dumps(entry, allow_nan=False, separators=(",", ":"))
        _seen((key, hashlib.sha256(text.encode()).hexdigest()), (imports, compiled, warnings))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"), "tmp", replace_directory=True)
    except (OSError, TypeError, ValueError, RecursionError):
        pass


def _quotable(compiled: list[Compiled], file: str, text: str) -> None:
    """Let the locations of ``compiled``, read from the cache for ``text``, quote their lines
    (error carets of later diagnostics show them): the text is this thread's most recent of
    ``file``, and IR served from the cache, whose own file name refers to the text parsed or
    decoded with it (``read_entry``), refers to ``text`` again if that is gone (the entry was
    found by ``text``: the same text). A variant made of it holds it (``Variant``)."""
    name = compiled[0].variant.file if compiled else file
    SOURCES.add_parsed(name if name == file else file, text)


def compile_cached(text: str, file: str) -> tuple[list[Compiled], tuple[Diagnostic, ...]]:
    """``attnc.compiler.pipeline.compile_source``, through the cache."""
    path = None
    if enabled():
        key = entry_key(text, file)
        path = _usable_entry_path(key)
    if path is not None:
        held = SourceText(text)  # what IR decoded now refers to, held until it is kept
        found = read_entry(path, key, SourceName(file, held))
        if found is not None:
            compiled = [remember(c) for c in found[0]]
            _quotable(compiled, file, text)  # keeps ``held`` for IR decoded now
            return compiled, found[1]
    from attnc.compiler.pipeline import compile_with_imports

    compiled, warnings, imported = compile_with_imports(text, file)
    if path is not None:
        write_entry(path, key, imported, tuple(compiled), warnings)
    return compiled, warnings


def _usable_entry_path(key: str) -> Path | None:
    """``_entry_path(key)``, or None where there is no cache root (``cache_dir``'s
    ``ValueError``, said under ATTNC_VERBOSE): the source is compiled, nothing kept."""
    try:
        return _entry_path(key)
    except ValueError as exc:
        if verbose():
            print(f"attnc: compile cache not used ({printable(str(exc))})", file=sys.stderr)
        return None
