"""The score in log2 units straight from the raw dot product, for scores that are not affine.

Kernels turn the raw dot product ``raw`` of a query and a key into the exp2 argument
``log2(e) * score(raw * sm_scale)``. Written that way, a general score such as a soft-cap
``cap * tanh(score / cap)`` costs four multiplies per element besides its ``tanh``. This pass
builds the same value as one expression of ``raw`` (``score`` below), with ``sm_scale`` and
``log2(e)`` inside it, and simplifies it: the constants then meet the variant's own
(``tanh(raw * (sm_scale / cap)) * (log2(e) * cap)``) and are hoisted, two multiplies left.
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.mask_split import substitute
from attnc.compiler.simplify import simplify_expr

LOG2E = 1.4426950408889634
SCORE = ir.Builtin("score", ir.F32)
SM_SCALE = ir.Builtin("sm_scale", ir.F32)


def score_log2(score: ir.Expr | None) -> ir.Expr:
    """``log2(e) * score`` with the incoming score replaced by ``score * sm_scale``, simplified
    (the identity score when ``score`` is None)."""
    body = SCORE if score is None else score
    loc = body.loc
    scaled = ir.Binary("*", SCORE, SM_SCALE, ir.F32, loc=loc)
    inner = substitute(body, SCORE, scaled)
    return simplify_expr(ir.Binary("*", ir.Const(LOG2E, ir.F32, loc=loc), inner, ir.F32, loc=loc))
