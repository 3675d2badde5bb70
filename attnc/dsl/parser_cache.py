"""The built `.attn` parser kept on disk, so a new process does not rebuild its tables.

Building the LALR tables takes 0.3 s, and over a second where the optional ``interegular``
package is installed (Lark then checks every pair of terminals for collisions); reading the
saved tables takes a few milliseconds. The file is ``<cache root>/parser/attn-<key>.lark``,
where the key hashes the grammar text, the Lark options, Lark's version and Python's, so any
change builds a new file. It holds a header line naming the key and the sha256 of the rest,
then Lark's serialised tables as JSON (data only: no pickle, nothing executed), handed to
Lark's loader of serialised tables. Lark's tables hold tuples and dicts with int keys, which JSON
lacks, so every dict is written as ``{"d": [[key, value], ...]}`` and every tuple as
``{"t": [...]}``; any other JSON object is refused. Files over 4 MiB are not read. The digest is
checked before the JSON is read: a table damaged in place (one digit changed) could load and then
fail inside Lark's parser, or parse wrongly.

The cache is an optimisation and never an error: a file that cannot be read or does not load
(truncated, corrupt, from another Lark) is replaced by a fresh build, and a cache root that
cannot be written leaves the parser built in memory. Set ``ATTNC_VERBOSE=1`` to see why a file
was not used.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

from attnc.cache_root import cache_dir
from attnc.dsl.errors import printable
from attnc.regular_file import read_regular, write_atomically
from attnc.verbose import verbose

FORMAT = "attnc parser tables v3"
MAX_BYTES = 4 << 20


def _key(grammar: str, options: dict[str, object]) -> str:
    h = hashlib.sha256()
    for part in (FORMAT, grammar, repr(sorted(options.items())), lark.__version__, sys.version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def parser_file(grammar: str, options: dict[str, object]) -> Path:
    """Where the parser of ``grammar`` built with ``options`` is kept."""
    return cache_dir() / "parser" / f"attn-{_key(grammar, options)[:16]}.lark"


def _encode(value: object) -> object:
    """Lark's serialised tables as JSON values (dicts and tuples tagged, see above)."""
    if isinstance(value, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"t": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"a serialised table holds a {type(value).__name__}")


def _decode_object(obj: dict[str, object]) -> object:
    """One JSON object back to the dict or tuple it tags (object_hook, innermost first)."""
    if set(obj) == {"d"} and isinstance(obj["d"], list):
        pairs = obj["d"]
        if all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return {k: v for k, v in pairs}
    if set(obj) == {"t"} and isinstance(obj["t"], list):
        return tuple(obj["t"])
    raise ValueError(f"an untagged JSON object with keys {sorted(obj)[:4]}")


def _header(key: str, body: str) -> str:
    """The first line of the file of ``key`` whose tables are ``body``."""
    digest = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{FORMAT} {key} {digest}\n"


def _read_tables(path: Path, key: str) -> dict[str, object] | None:
    """The serialised tables in ``path``; None when it is missing; ValueError when it is not
    this key's file of tables."""
    try:
        data = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    if len(data) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES} bytes")
    text = data.decode("utf-8")
    header, _, body = text.partition("\n")
    if not header.startswith(f"{FORMAT} {key} "):
        raise ValueError("not this grammar's tables (header differs)")
    if header + "\n" != _header(key, body):
        raise ValueError("damaged (its digest differs)")
    tables = json.loads(body, object_hook=_decode_object)
    if not (isinstance(tables, dict) and set(tables) == {"data", "memo"}):
        raise ValueError("not a table of data and memo")
    return tables


def _say(message: str) -> None:
    if verbose():
        print(f"attnc: {printable(message)}", file=sys.stderr)


def _load(path: Path, key: str) -> Lark | None:
    try:
        tables = _read_tables(path, key)
        if tables is None:
            return None
        return Lark._load_from_dict(tables["data"], tables["memo"])  # type: ignore[no-any-return]
    except Exception as exc:  # any damage to the file, or a Lark without the loader
        _say(f"parser cache {path} not used ({type(exc).__name__}: {exc}); rebuilding it")
        return None


def _save(parser: Lark, path: Path, key: str) -> None:
    """Write ``parser``'s tables to ``path`` through a temporary file renamed into place, so
    that a reader never sees half a file."""
    try:
        data, memo = parser.memo_serialize([TerminalDef, Rule])
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(_encode({"data": data, "memo": memo}), separators=(",", ":"))
        encoded = (_header(key, body) + body).encode("utf-8")
        write_atomically(path, encoded, ".attn-", replace_directory=True)
    except (OSError, ValueError, TypeError) as exc:
        _say(f"parser cache {path} not written ({type(exc).__name__}: {exc})")


def cached_parser(grammar: str, options: dict[str, object], build: Callable[[], Lark]) -> Lark:
    """The parser saved for ``grammar`` and ``options``, else ``build()``, saved for next
    time."""
    key = _key(grammar, options)
    try:
        path = parser_file(grammar, options)
    except ValueError as exc:  # no cache root (cache_root.cache_dir): build, keep nothing
        _say(f"parser cache not used ({exc})")
        return build()
    parser = _load(path, key)
    if parser is None:
        parser = build()
        _save(parser, path, key)
    return parser
