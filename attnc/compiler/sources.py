"""Where variant sources come from: a path, ``stdlib:NAME`` (the shipped
``stdlib_variants/`` folder) or inline text."""

from __future__ import annotations

import errno
import os
import re

from attnc.dsl.errors import printable
from attnc.dsl.source_text import read_source

STDLIB_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "stdlib_variants")
STDLIB_PREFIX = "stdlib:"
_SOURCE_WORD = re.compile(r"\bvariant\b")  # not the folder name stdlib_variants/
_STDLIB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def resolve_source(spec: str) -> tuple[str, str]:
    """(text, file name) of a path, ``stdlib:NAME`` or inline source text.

    An existing file is read whatever its name holds (``{``, newlines); other text is source
    only when it holds a newline, or the word ``variant`` and a ``{`` (a variant's body):
    anything else is a missing file (``models/variant/x.attn`` too)."""
    if spec.startswith(STDLIB_PREFIX):
        name = spec[len(STDLIB_PREFIX) :]
        path = os.path.join(STDLIB_DIR, f"{name}.attn")
        # A plain file name only: no separators (stdlib:../x, stdlib:/abs/path leave the folder).
        if not _STDLIB_NAME.fullmatch(name) or not os.path.isfile(path):
            raise FileNotFoundError(
                f"no stdlib variant '{printable(name)}'; available: {', '.join(stdlib_names())}"
            )
        return read_source(path), path
    if os.path.isfile(spec):
        return read_source(spec), file_name(spec)
    shipped = os.path.join(os.path.dirname(STDLIB_DIR), spec)
    if spec.startswith("stdlib_variants/") and os.path.isfile(shipped):
        return read_source(shipped), shipped  # the package's own folder, as the docs spell it
    if "\n" in spec or (_SOURCE_WORD.search(spec) and "{" in spec):  # variant NAME { ... }
        return spec, "<string>"
    return resolve_path(spec)  # raises: no such file


def file_name(path: str) -> str:
    """The name a file's source goes by: ``path``, or ``./path`` when it starts with ``<``
    (a ``<...>`` name is inline source, whose imports resolve from the working directory)."""
    return os.path.join(".", path) if path.startswith("<") else path


def resolve_path(path: str) -> tuple[str, str]:
    """(text, file name) of the file at ``path``; a path no file can have (a NUL byte, a
    character the file system's encoding cannot hold, a name past the system's length
    limit) is a ``FileNotFoundError`` like a missing file."""
    try:
        return read_source(path), file_name(path)
    except UnicodeEncodeError:  # a character the file system's encoding cannot hold
        why = "the file system cannot encode one of its characters"
    except ValueError:  # os.open's answer to a NUL byte
        why = "a path cannot hold a NUL byte"
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:
            raise
        why = "the name is longer than the system allows"
    shown = path[:200] + ("..." if len(path) > 200 else "")  # str() shows its repr: escaped
    raise FileNotFoundError(errno.ENOENT, f"no such file ({why})", shown) from None


def stdlib_names() -> list[str]:
    """Names of the shipped variant files (those defining at least one variant)."""
    names = []
    for fname in sorted(os.listdir(STDLIB_DIR)):
        if fname.endswith(".attn"):
            with open(os.path.join(STDLIB_DIR, fname), encoding="utf-8") as f:
                if "variant " in f.read():
                    names.append(fname[: -len(".attn")])
    return names
