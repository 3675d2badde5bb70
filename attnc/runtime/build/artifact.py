"""Owns: the integrity of built shared libraries in the cache.

A library is accepted only when it is a whole ELF file (header, program and section header
tables inside the file) and matches the build record written next to it at build time
(``built.ok``: JSON with its size, sha256, cache key and the release of the nvcc that built
it). A library that fails either check is never handed to ``dlopen`` (a truncated ``.so``
makes the loader die with SIGBUS) and is rebuilt, as is one whose record names another cache
key (an entry copied or linked from another module: another arch, dtype or head_dim) or,
where the build checks it, another nvcc release than the one installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path

from attnc.dsl.errors import printable
from attnc.regular_file import read_regular

RECORD_FORMAT = 1
MAX_RECORD_BYTES = 1 << 16  # a build record is a few hundred bytes of JSON
_VERIFIED: dict[tuple[str, int, int, int], str | None] = {}
_VERIFIED_LOCK = threading.Lock()


def elf_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole 64-bit little-endian ELF file, or None when it is."""
    try:  # a pipe left at the path is refused, not waited on
        header = read_regular(path, 63, "a shared library")
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if len(header) < 64 or header[:4] != b"\x7fELF":
        return "not an ELF file"
    if header[4] != 2 or header[5] != 1:
        return "not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
    if phoff + phentsize * phnum > size or shoff + shentsize * shnum > size:
        return f"truncated ELF file ({size} bytes)"
    return None


def file_sha256(path: Path) -> str:
    """sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_text(library: Path, command: str, key: str, nvcc: str | None) -> str:
    """The build record of ``library`` (just built): its size, sha256, build command, the
    cache ``key`` it was built for and the release line of the ``nvcc`` that built it."""
    record = {
        "format": RECORD_FORMAT,
        "size": library.stat().st_size,
        "sha256": file_sha256(library),
        "command": command,
        "key": key,
        "nvcc": nvcc,
    }
    return json.dumps(record, indent=1) + "\n"


def _read_record(stamp: Path) -> dict[str, object] | None:
    try:
        data = read_regular(stamp, MAX_RECORD_BYTES)
        if len(data) > MAX_RECORD_BYTES:
            return None
        record = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return None
    return record


def _key_problem(record: dict[str, object], key: str | None) -> str | None:
    if key is None or record.get("key") == key:
        return None
    if "key" not in record:
        return "its build record names no cache key (written by an older attnc)"
    return f"its build record is for {printable(str(record['key']))}, not {key}"


def _nvcc_problem(record: dict[str, object], nvcc: str | None) -> str | None:
    if nvcc is None or record.get("nvcc") == nvcc:
        return None
    built = f"'{printable(str(record['nvcc']))}'" if record.get("nvcc") else "an unrecorded nvcc"
    return f"it was built by {built}, not by the installed nvcc '{printable(nvcc)}'"


def _check(library: Path, stamp: Path | None, key: str | None, nvcc: str | None) -> str | None:
    problem = elf_problem(library)
    if problem is not None or stamp is None:
        return problem
    record = _read_record(stamp)
    if record is None:
        return f"its build record {printable(str(stamp))} is missing or unreadable"
    problem = _key_problem(record, key) or _nvcc_problem(record, nvcc)
    if problem is not None:
        return problem
    size = library.stat().st_size
    if record.get("size") != size:
        return f"its size {size} differs from the {record.get('size')} bytes built"
    if record.get("sha256") != file_sha256(library):
        return "its sha256 differs from the one recorded at build"
    return None


def _identity(
    library: Path, stamp: Path | None, key: str | None, nvcc: str | None
) -> tuple[str, int, int, int]:
    st = os.stat(library)
    stamp_mtime = os.stat(stamp).st_mtime_ns if stamp is not None else 0
    text = f"{library}\0{stamp}\0{stamp_mtime}\0{key}\0{nvcc}"
    return (text, st.st_size, st.st_mtime_ns, st.st_ino)


def mark_sound(library: Path, stamp: Path, key: str, nvcc: str | None) -> None:
    """Remember that ``library`` matches ``stamp`` of cache ``key`` built by ``nvcc`` (both
    just written by this process), so the first load after a build needs no second hash."""
    with _VERIFIED_LOCK:
        _VERIFIED[_identity(library, stamp, key, nvcc)] = None
        _VERIFIED[_identity(library, stamp, None, None)] = None


def library_problem(
    library: Path, stamp: Path | None, key: str | None = None, nvcc: str | None = None
) -> str | None:
    """Why ``library`` must not be loaded (checked against the build record ``stamp`` when
    given, and that record against the cache ``key`` and the release line of the installed
    ``nvcc`` when given), or None when it is sound. The answer is memoised per file
    identity, so hashing happens once per process and file."""
    try:
        identity = _identity(library, stamp, key, nvcc)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    with _VERIFIED_LOCK:
        if identity in _VERIFIED:
            return _VERIFIED[identity]
    problem = _check(library, stamp, key, nvcc)
    with _VERIFIED_LOCK:
        _VERIFIED[identity] = problem
    return problem
