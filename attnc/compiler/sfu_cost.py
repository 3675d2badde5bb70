"""Special-function operations per element: what a score costs the GPU's special-function
unit (MUFU: the hardware tanh, exp2, log2, reciprocal, square root) for every (query, key)
pair, its row- and request-level parts hoisted out.

The softmax already spends one such operation per element on its exp2. A score with one more
(a soft-cap's ``tanh``) makes that unit, not the tensor cores, the bound of a Hopper kernel:
the kernels then move part of the softmax's exp2s to the FMA units (``kScoreSfuOps`` of the
functor, ``attnc/poly_exp2.cuh``). The count is a cost estimate of the functions as
``attnc/variant_math.cuh`` implements them, not an exact instruction count.
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.hoist import level

# Special-function operations of each built-in as variant_math.cuh computes it on the device.
CALL_COST: dict[str, int] = {
    "tanh": 1,  # tanh.approx
    "exp": 1,  # ex2.approx
    "exp2": 1,
    "log": 1,  # lg2
    "log2": 1,
    "sqrt": 1,  # rsq (+ a multiply)
    "rsqrt": 2,  # 1 / sqrt: rsq and rcp
    "sigmoid": 2,  # ex2 and rcp
    "softplus": 2,  # ex2 and lg2
}


def sfu_ops_per_element(e: ir.Expr | None) -> int:
    """Special-function operations of ``e`` per element: its element-level calls (a node shared
    by several parents once, as the emitted code computes it once) and f32 divisions."""
    if e is None:
        return 0
    total = 0
    for node in ir.postorder(e):
        if level(node) < ir.ELEMENT:
            continue
        if isinstance(node, ir.Call):
            total += CALL_COST.get(node.fn, 0)
        elif isinstance(node, ir.Binary) and node.op == "/" and node.type == ir.F32:
            total += 1  # rcp
    return total
