"""What a variant's per-element score costs the kernels beyond its arithmetic: the calls that
run on the MUFU pipe, which the softmax's exp2 shares (the functor's
``kScoreTranscendentals``; the Hopper template then moves part of the exp2s to the FMA pipe)."""

from __future__ import annotations

from collections.abc import Mapping

from attnc.compiler import ir
from attnc.compiler.score_raw import INV1P_EXP2

# The functions the device evaluates through the MUFU pipe (tanh.approx, ex2.approx,
# rcp.approx, lg2.approx, rsqrt.approx, ...), the compiler's inv1p_exp2 among them.
TRANSCENDENTAL_FUNCTIONS = frozenset(
    {"tanh", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus", INV1P_EXP2}
)


def element_transcendentals(e: ir.Expr, hoisted: Mapping[ir.Expr, str]) -> int:
    """How many distinct calls of :data:`TRANSCENDENTAL_FUNCTIONS` ``e`` evaluates per
    element: those inside ``hoisted`` sub-expressions (per row or request, or key terms
    computed once per key) are not counted."""
    return sum(
        isinstance(n, ir.Call) and n.fn in TRANSCENDENTAL_FUNCTIONS
        for n in ir.walk(e, below=lambda n: n not in hoisted)
        if n not in hoisted
    )
