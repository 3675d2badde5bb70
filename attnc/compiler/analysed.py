"""Owns: the analyses of optimised IR for the back ends: remembered ones, else computed now.

Kept apart from ``results`` and ``pipeline`` so imports stay one way (pipeline -> results;
this module -> results, and pipeline only when SymPy is really needed).
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.results import Compiled, known, remember


def analysed(v: ir.VariantIR) -> Compiled:
    """The analyses of optimised IR ``v``: remembered ones, else computed now."""
    found = known(v)
    if found is not None:
        return found
    from attnc.compiler.pipeline import analyse  # SymPy: only when not known

    return remember(analyse(v))
