"""Owns: the span table the C++ decode step reads to compute each request's mask span from its
KV length (``attnc/kernels/host/decode_plan_spans.h``), built once per planned mask and
``q_len`` from the mask analysis: every linear bound ``cq*q_idx + ck*kv_idx + c >= 0`` with
``c = c0 + ckv*kv_len``, q_len and the plan-time scalar params folded into ``c0``.

Masks whose bounds read anything else (a per-request tensor, ``batch``, an expression the
analysis kept whole) get no table; the decode wrapper then computes the spans with
``mask_ranges.decode_spans`` as before. The step gives the same integers as
``tile_kv_ranges`` + ``decode_spans`` (tests compare both).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from attnc.compiler import ir
from attnc.compiler.mask_analysis import LinearConstraint, MaskAnalysis

_LIMIT = 1 << 62  # folded constants beyond this: no table (numpy's int64 would differ)


def span_table(
    analysis: MaskAnalysis, params: Mapping[str, object], q_len: int
) -> np.ndarray | None:
    """The int64 span table of ``analysis`` (a ``linear`` or ``union`` mask) for requests of
    ``q_len`` queries with the plan-time ``params`` (integers are used, as ``tile_kv_ranges``
    does); None when a bound reads anything but q_len, kv_len and those params."""
    if analysis.kind not in ("linear", "union"):
        return None
    known = {k: int(v) for k, v in params.items() if isinstance(v, numbers.Integral)}
    terms = analysis.terms if analysis.kind == "union" else (analysis.constraints,)
    out: list[int] = [len(terms), len(analysis.wrap_guards)]
    for cons in terms:
        out.append(len(cons))
        for x in cons:
            row = _row(x, known, q_len)
            if row is None:
                return None
            out.extend(row)
    for guard in analysis.wrap_guards:
        row = _row(guard, known, q_len)
        if row is None:
            return None
        out.extend(row)
    return np.array(out, dtype=np.int64)


def _row(x: LinearConstraint, known: Mapping[str, int], q_len: int) -> list[int] | None:
    """(cq, ck, c0, ckv) of one bound, or None when it reads something else."""
    c0, ckv = int(x.offset), 0
    for coef, atom in x.terms:
        if isinstance(atom, ir.Builtin) and atom.name == "kv_len":
            ckv += int(coef)
        elif isinstance(atom, ir.Builtin) and atom.name == "q_len":
            c0 += int(coef) * q_len
        elif isinstance(atom, ir.ParamRef) and atom.name in known:
            c0 += int(coef) * known[atom.name]
        else:
            return None
    row = [int(x.cq), int(x.ck), c0, ckv]
    return row if all(-_LIMIT < v < _LIMIT for v in row) else None
