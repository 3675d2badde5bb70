"""Which forms of a variant's score the functor defines, and which one the kernels evaluate
per element (the form whose key terms and transcendentals count)."""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.results import Compiled
from attnc.compiler.score_log2 import score_log2
from attnc.compiler.score_raw import score_raw


def score_forms(compiled: Compiled) -> tuple[ir.Expr | None, ir.Expr | None]:
    """The score's forms the functor has hooks for: the log2 form (softmax without an affine
    score) and the raw form (no softmax, any score), None where there is none."""
    v = compiled.variant
    softmax = v.normalize == "softmax"
    log2_score = score_log2(v.score) if compiled.affine is None and softmax else None
    raw_score = score_raw(v.score) if v.score is not None and v.normalize == "none" else None
    return log2_score, raw_score


def element_score(
    compiled: Compiled, log2_score: ir.Expr | None, raw_score: ir.Expr | None
) -> ir.Expr | None:
    """The one form of the score the kernels evaluate per element: an affine score's bias,
    else the log2 form (softmax) or the raw form (no softmax) from :func:`score_forms`."""
    if compiled.affine is not None:
        return compiled.affine.bias
    return log2_score or raw_score
