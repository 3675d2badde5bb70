"""The weight of a variant without softmax straight from the raw dot product.

Without softmax, kernels turn the raw dot product ``raw`` into the weight
``score(raw * sm_scale)``. Written that way, ``sigmoid(score + bias)`` costs a multiply and an
add before, and a multiply by ``-log2(e)`` inside, its ``exp2``. This pass builds the same
value as one expression of ``raw`` (``score`` below), with ``sm_scale`` inside it and each
``sigmoid(x)`` written as ``inv1p_exp2(-log2(e) * x)`` (``1 / (1 + 2^y)``, a function only the
compiler writes), and simplifies it: the constants meet (``inv1p_exp2(raw * c1 + c2)`` with
``c1 = -log2(e) * sm_scale`` and ``c2 = -log2(e) * bias`` hoisted), one FFMA left before the
``exp2`` (RESULTS.md run 41 timed that instruction sequence: sigmoid 8K -3.8% at d=128, -5.2%
at d=64).
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.mask_split import substitute
from attnc.compiler.score_log2 import LOG2E, SCORE, SM_SCALE
from attnc.compiler.simplify import simplify_expr

# 1 / (1 + 2^y): the sigmoid of -y * ln(2). Never parsed from .attn text.
INV1P_EXP2 = "inv1p_exp2"


def score_raw(score: ir.Expr) -> ir.Expr:
    """``score`` with the incoming score replaced by ``score * sm_scale`` and each sigmoid
    written in log2 units, simplified."""
    scaled = ir.Binary("*", SCORE, SM_SCALE, ir.F32, loc=score.loc)
    body = substitute(score, SCORE, scaled)
    while (call := _first_sigmoid(body)) is not None:
        arg = call.args[0]
        y = ir.Binary("*", ir.Const(-LOG2E, ir.F32, loc=call.loc), arg, ir.F32, loc=call.loc)
        body = substitute(body, call, ir.Call(INV1P_EXP2, (y,), ir.F32, loc=call.loc))
    return simplify_expr(body)


def _first_sigmoid(e: ir.Expr) -> ir.Call | None:
    """The first sigmoid call of ``e`` in post-order (an innermost one), or None."""
    for node in ir.postorder(e):
        if isinstance(node, ir.Call) and node.fn == "sigmoid":
            return node
    return None
