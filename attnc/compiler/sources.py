"""Where variant sources come from: a path, ``stdlib:NAME`` (the shipped
``stdlib_variants/`` folder) or inline text."""

from __future__ import annotations

import os

from attnc.dsl.source_text import read_source

STDLIB_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "stdlib_variants")
STDLIB_PREFIX = "stdlib:"


def resolve_source(spec: str) -> tuple[str, str]:
    """(text, file name) of a path, ``stdlib:NAME`` or inline source text."""
    if spec.startswith(STDLIB_PREFIX):
        name = spec[len(STDLIB_PREFIX) :]
        path = os.path.join(STDLIB_DIR, f"{name}.attn")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no stdlib variant '{name}'; available: {', '.join(stdlib_names())}"
            )
        spec = path
    if "{" in spec or "\n" in spec:
        return spec, "<string>"
    shipped = os.path.join(os.path.dirname(STDLIB_DIR), spec)
    if not os.path.exists(spec) and spec.startswith("stdlib_variants/") and os.path.isfile(shipped):
        spec = shipped  # the package's own folder, as the docs spell it
    return read_source(spec), spec


def stdlib_names() -> list[str]:
    """Names of the shipped variant files (those defining at least one variant)."""
    names = []
    for fname in sorted(os.listdir(STDLIB_DIR)):
        if fname.endswith(".attn"):
            with open(os.path.join(STDLIB_DIR, fname), encoding="utf-8") as f:
                if "variant " in f.read():
                    names.append(fname[: -len(".attn")])
    return names
