"""What the middle end hands to the back ends: one variant's optimised IR with its affine and
mask analyses (``Compiled``), and a memo of those analyses by IR, so code generation for an
already compiled variant needs neither SymPy nor the parser (a cached load stays fast).
Imports nothing of the passes (``analysed`` computes missing analyses)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from attnc.compiler import ir
from attnc.compiler.mask_analysis import MaskAnalysis
from attnc.dsl.limits import deep_recursion


@dataclass(frozen=True)
class AffineScore:
    """``score' = scale * score + bias``; ``scale`` is at most row-level, ``bias`` is free of
    the score. ``identity`` is true for scale 1 and bias 0."""

    scale: ir.Expr
    bias: ir.Expr
    identity: bool


@dataclass(frozen=True)
class Compiled:
    """One variant after every pass: unsimplified and optimised IR plus the analyses."""

    lowered: ir.VariantIR
    variant: ir.VariantIR
    affine: AffineScore | None
    mask_analysis: MaskAnalysis

    def __repr__(self) -> str:
        """The variant's name, file and mask analysis kind: the IR itself is a DAG whose
        unfolded text can grow exponentially (a traceback that printed it never ended)."""
        v = self.variant
        return f"Compiled(variant={v.name!r}, file={v.file!r}, mask={self.mask_analysis.kind!r})"


# Weak values: an entry lives while its Compiled is held (by a Variant, a cache entry), so
# loading many distinct variants over a process's life does not keep them all. A lookup may
# compare two separately built copies of one IR (compiled here and read from the disk cache,
# say), which recurses once per level of its deepest expression: lookups run with the passes'
# recursion room.
_KNOWN: weakref.WeakValueDictionary[ir.VariantIR, Compiled] = weakref.WeakValueDictionary()


def remember(c: Compiled) -> Compiled:
    """Record ``c`` as the analyses of ``c.variant``, unless equal IR's are known already
    (those stay: their holder may outlive ``c``); returns ``c``."""
    with deep_recursion():
        if _KNOWN.get(c.variant) is None:
            _KNOWN[c.variant] = c
    return c


def known(v: ir.VariantIR) -> Compiled | None:
    """The remembered analyses of optimised IR ``v``, if any."""
    with deep_recursion():
        return _KNOWN.get(v)
