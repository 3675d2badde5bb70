"""The class of a tile of an analysed mask in plain Python: the reference the generated
``classify`` (``linear_classify`` / ``linear_union_classify`` of ``attnc/mask_math.cuh``) is
tested against, beside ``attnc.compiler.mask_tiles.kv_range``. Not used by the runtime.
Importable from every test tier as ``import tile_class_oracle`` (pytest puts tests/, the folder
of tests/conftest.py, on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Mapping

from attnc.compiler.mask_analysis import MaskAnalysis
from attnc.compiler.mask_tiles import Tensors, _may_wrap, _project, _values


def classify(
    analysis: MaskAnalysis,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    env: Mapping[str, int],
    tensors: Tensors = None,
) -> str:
    """Class of the tile ``[q0, q1) x [k0, k1)``: ``empty``, ``full`` or ``partial``.

    The tile must lie inside the valid range: ``0 <= q0 < q1 <= q_len`` and
    ``0 <= k0 < k1 <= kv_len`` (the kernels clip tiles before asking). A mask that reads
    data (``analysis.reads_data``) is never ``full``.
    """
    found = _classify(analysis, q0, q1, k0, k1, env, tensors)
    return "partial" if found == "full" and analysis.reads_data else found


def _classify(analysis, q0, q1, k0, k1, env, tensors) -> str:
    if q0 >= q1 or k0 >= k1:
        return "empty"
    if analysis.kind == "none":
        return "full"
    if analysis.kind == "opaque" or _may_wrap(analysis, env, tensors):
        return "partial"
    if analysis.kind == "union":
        found = [_linear_classify(_values(t, env, tensors), q0, q1, k0, k1) for t in analysis.terms]
        if "full" in found:
            return "full"
        return "empty" if all(x == "empty" for x in found) else "partial"
    return _linear_classify(_values(analysis.constraints, env, tensors), q0, q1, k0, k1)


def _linear_classify(cons: list[tuple[int, int, int]], q0: int, q1: int, k0: int, k1: int) -> str:
    lo, hi = _project(cons, q0, q1 - 1, k0, k1 - 1)
    if lo > hi:
        return "empty"
    for cq, ck, c in cons:
        worst = cq * (q0 if cq >= 0 else q1 - 1) + ck * (k0 if ck >= 0 else k1 - 1) + c
        if worst < 0:
            return "partial"
    return "full"
