"""IR verifier: the pipeline runs it after lowering and after simplification.

Checks that every node's type follows the typing rules, so a pass that breaks them fails
loudly at the pass, not as wrong CUDA later.
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.token_index import first_index_error


class IRVerifyError(AssertionError):
    """An IR invariant does not hold (a compiler bug, not a user error)."""


def verify_variant(v: ir.VariantIR, stage: str = "") -> None:
    """Raise IRVerifyError if ``v`` is malformed."""
    where = f" after {stage}" if stage else ""
    wants = {"score": ir.F32, "mask": ir.BOOL, "output": ir.F32, "sink": ir.F32}
    for name, e in v.slots():
        want = wants[name]
        if e is None:
            continue
        if e.type != want:
            raise IRVerifyError(f"{v.name}.{name}{where}: type {e.type}, expected {want}")
        for node in ir.walk(e):
            _check_node(node, v, f"{v.name}.{name}{where}")
        if name != "output" and any(
            isinstance(n, ir.Builtin) and n.name == ir.OUTPUT_BUILTIN for n in ir.walk(e)
        ):
            raise IRVerifyError(f"{v.name}.{name}{where}: 'out' outside output")
    if v.sink is not None:
        if v.normalize != "softmax":
            raise IRVerifyError(f"{v.name}.sink{where}: a sink without softmax")
        if any(
            isinstance(n, ir.Builtin) and n.name in ("score", "kv_idx") for n in ir.walk(v.sink)
        ):
            raise IRVerifyError(f"{v.name}.sink{where}: reads an element-level built-in")
    if v.normalize not in ("softmax", "none"):
        raise IRVerifyError(f"{v.name}{where}: bad normalize {v.normalize!r}")


def _check_node(e: ir.Expr, v: ir.VariantIR, where: str) -> None:
    if e.type not in ir.TYPES:
        raise IRVerifyError(f"{where}: bad type {e.type!r} on {type(e).__name__}")
    if isinstance(e, ir.Binary):
        if e.a.type != e.b.type:
            raise IRVerifyError(f"{where}: operands of {e.op} have types {e.a.type}, {e.b.type}")
        want = ir.BOOL if e.op in ir.COMPARISONS or e.op in ir.LOGICAL else e.a.type
        if e.type != want:
            raise IRVerifyError(f"{where}: {e.op} has type {e.type}, expected {want}")
    elif isinstance(e, ir.Select):
        if e.cond.type != ir.BOOL or e.a.type != e.b.type or e.a.type != e.type:
            raise IRVerifyError(f"{where}: malformed select")
    elif isinstance(e, ir.Unary):
        if (e.op == "not") != (e.type == ir.BOOL) or e.x.type != e.type:
            raise IRVerifyError(f"{where}: malformed unary {e.op}")
    elif isinstance(e, ir.Call):
        if e.fn not in ir.FUNCTIONS or len(e.args) != ir.FUNCTIONS[e.fn][0]:
            raise IRVerifyError(f"{where}: bad call {e.fn}")
        if any(a.type != e.type for a in e.args):
            raise IRVerifyError(f"{where}: arguments of {e.fn} do not have type {e.type}")
    elif isinstance(e, ir.TensorLoad):
        decl = v.param(e.name)
        if decl.kind != "tensor" or len(decl.dims) != len(e.indices) or decl.dtype != e.type:
            raise IRVerifyError(f"{where}: bad load of {e.name}")
        if any(i.type != ir.I32 for i in e.indices):
            raise IRVerifyError(f"{where}: non-i32 index of {e.name}")
        if first_index_error(decl, e.indices[0]) is not None:
            raise IRVerifyError(f"{where}: {e.name} read outside its request's slice")
    elif isinstance(e, ir.ParamRef):
        decl = v.param(e.name)
        if decl.kind != "scalar" or decl.dtype != e.type:
            raise IRVerifyError(f"{where}: bad param reference {e.name}")
    elif isinstance(e, ir.Builtin):
        if e.name != ir.OUTPUT_BUILTIN and ir.BUILTINS[e.name][0] != e.type:
            raise IRVerifyError(f"{where}: built-in {e.name} has type {e.type}")
