"""Owns: the index rule of batch-flattened tensors (language v2).

A tensor whose first dim is ``kv_len`` holds one value per KV token, ``q_len`` one per query
token, ``batch_size`` one per request, flattened over the requests of a batch. The kernels
read it at the request's offset plus the first index, so that index must be a value the
checker can prove lies inside the request's slice: ``kv_idx`` or ``q_pos`` for ``kv_len``
(both are KV-token positions), ``q_idx`` for ``q_len`` and ``batch`` for ``batch_size``.
Lowering reports a violation at the index; the IR verifier checks the rule after every pass.
"""

from __future__ import annotations

from attnc.compiler import ir

_WHAT = {
    "kv_len": "one value per KV token",
    "q_len": "one value per query token",
    "batch_size": "one value per request",
}


def allowed_first_indices(decl: ir.ParamDecl) -> tuple[str, ...] | None:
    """The built-ins the first index of ``decl`` may be, or None when any i32 is allowed."""
    dim = decl.token_dim
    return None if dim is None else ir.TOKEN_DIMS[dim]


def first_index_error(decl: ir.ParamDecl, index: ir.Expr) -> str | None:
    """Why ``index`` cannot be the first index of ``decl`` (None when it can)."""
    allowed = allowed_first_indices(decl)
    if allowed is None:
        return None
    if isinstance(index, ir.Builtin) and index.name in allowed:
        return None
    dim = decl.token_dim
    names = " or ".join(allowed)
    return (
        f"tensor '{decl.name}' has {_WHAT[str(dim)]} (dim {dim}): its first index must be "
        f"{names}, exactly, so the read stays inside the request"
    )


def token_tensors_read(e: ir.Expr | None, params: tuple[ir.ParamDecl, ...]) -> tuple[str, ...]:
    """The names, sorted, of the ``kv_len`` and ``q_len`` tensors (per-token values) ``e``
    reads (none when ``e`` is None)."""
    token = {p.name for p in params if p.token_dim in ("kv_len", "q_len")}
    if e is None or not token:
        return ()
    return tuple(sorted({n.name for n in ir.walk(e) if isinstance(n, ir.TensorLoad)} & token))


def reads_token_tensor(e: ir.Expr, params: tuple[ir.ParamDecl, ...]) -> bool:
    """Whether ``e`` reads a ``kv_len`` or ``q_len`` tensor (a per-token value): for the
    mask, the functor's ``kMaskReadsTokens`` and the runtime's tile map."""
    return bool(token_tensors_read(e, params))
