"""Owns: the command-line lists of integer pairs the probes take (``--shapes 48x64,64x64``,
``--rows 8192:128,...``): split, checked for their form, shown escaped in the error."""

from __future__ import annotations

import re


def int_pairs(text: str, flag: str, sep: str, form: str, digits: int) -> list[tuple[str, int, int]]:
    """``A<sep>B,...`` as (entry, a, b) per entry, each side at most ``digits`` digits; an
    entry of another form raises ValueError naming ``flag`` and ``form``. Callers check the
    ranges and name the entry (shown escaped) in their own errors."""
    side = re.compile(rf"[0-9]{{1,{digits}}}")
    out = []
    for item in text.split(","):
        parts = item.strip().split(sep)
        if len(parts) != 2 or not all(side.fullmatch(p) for p in parts):
            raise ValueError(f"{flag}: {item!r} is not {form}")
        out.append((item, int(parts[0]), int(parts[1])))
    return out
