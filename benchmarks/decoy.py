"""The decoy check: does each output compute the row's variant or its plain neighbour?

The cross-check's tolerance (``measure.REL_TOL``) cannot tell a soft-cap of 30 left out: on
the suite's inputs (scores of deviation about 1) the cap moves the output by 5e-3 to 6e-3,
about two bf16 kernels' disagreement. Along one direction, though, the two problems are far
apart. Each row whose variant has a score transform gets a decoy, the same variant with the
transform dropped (``decoy_variant``: softcap and ALiBi become plain causal attention,
sigmoid plain unnormalised scores). On the query rows the self-check compares (``pieces``),
both eager references are computed in float32, and each output is placed on the line from
the reference (0) to the decoy (1)::

    pull = sum <out - ref, decoy - ref> / sum ||decoy - ref||^2

The output is nearer the decoy than the reference exactly when its pull is above one half.
Rounding and accumulation noise is not aligned with ``decoy - ref`` and averages out over
the hundreds of thousands of values compared. Simulated on the suite's soft-cap inputs
(L = 2048): the reference rounded to bf16, with 1e-3 relative noise or computed as flash
kernels do (P rounded to bf16 before P.V) pulls within 5e-3 of 0; an output without the cap
pulls 0.99 to 1.0. A systematic error of a correct kernel can be aligned: an approximate
tanh that shrank every score by its largest relative error, 2^-11, pulls 0.09 there.

An output whose pull is at least ``DECOY_SPLIT`` is a mismatch. The check is left out where
the references are closer than ``DECOY_MIN_GAP`` (||decoy - ref|| / ||ref|| over the rows
compared), where an aligned systematic error could reach the midpoint. It uses the outputs
the cross-check already holds: no extra call of any system, no change to what is timed.
"""

from __future__ import annotations

import dataclasses
import math

from benchmarks.attnc_systems import CHECK_ROWS, keys_seen, load_variant, row_blocks

# An output at least this far from the row's reference towards its decoy is nearer the decoy.
DECOY_SPLIT = 0.5
# The least relative gap ||decoy - ref|| / ||ref|| the check needs: over four times the
# aligned error of a tanh shrunk by 2^-11 everywhere (3.4e-4: it would pull 0.23 at this gap).
# The suite's soft-cap rows have 2.9e-3 (L = 8192) to 3.6e-3 (L = 2048) on the self-check's
# blocks (the first rows see few keys, which the cap hardly changes), decode 7.6e-3.
DECOY_MIN_GAP = 1.5e-3
# Requests of a paged row compared (spread over the batch), at most CHECK_ROWS rows each.
CHECK_REQUESTS = 16

_DECOYS: dict[str, object] = {}


def decoy_variant(stdlib: str):
    """The stdlib variant with its score transform dropped (identity score, same mask,
    normalisation and output), cached; None when it has no score transform. Only its eager
    reference is used."""
    if stdlib not in _DECOYS:
        import attnc

        variant = load_variant(stdlib)
        compiled = variant.compiled
        if compiled.variant.score is None:
            _DECOYS[stdlib] = None
        else:
            plain = dataclasses.replace(
                compiled,
                lowered=dataclasses.replace(compiled.lowered, score=None),
                variant=dataclasses.replace(compiled.variant, score=None),
            )
            _DECOYS[stdlib] = attnc.Variant(plain)
    return _DECOYS[stdlib]


def pieces(case, data, variant) -> list[tuple]:
    """``(rows, q, k, v)``: query rows of the output (a slice) and the inputs on which the
    eager reference gives exactly those rows. A dense prefill row: the self-check's blocks
    (``row_blocks``, ``keys_seen``). A paged row (decode, batch prefill): the last rows of up
    to ``CHECK_REQUESTS`` requests spread over the batch, with all their keys. Else none."""
    from benchmarks.inputs import DenseData, PagedData

    if isinstance(data, DenseData):
        out = []
        for start, stop in row_blocks(case, variant):
            keys = keys_seen(case, stop)
            out.append((slice(start, stop), data.q[start:stop], data.k[:keys], data.v[:keys]))
        return out
    if isinstance(data, PagedData):
        qo, kv = data.qo_indptr.tolist(), data.kv_indptr.tolist()
        chosen = _spread(len(data.kv_lens), CHECK_REQUESTS)
        return [_request_piece(data, b, qo, kv) for b in chosen]
    return []


def _spread(count: int, most: int) -> list[int]:
    """Up to ``most`` indices evenly spaced over ``range(count)``, first and last included."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


def _request_piece(data, b: int, qo: list[int], kv: list[int]) -> tuple:
    """The last (at most ``CHECK_ROWS``) query rows of request ``b`` and its keys, gathered
    from the pages (bottom-right alignment gives the rows their own positions); ``qo`` and
    ``kv`` are the row's query and page indptr."""
    pages = data.kv_indices[kv[b] : kv[b + 1]].long()
    n = data.kv_lens[b]
    k = data.cache[pages, 0].flatten(0, 1)[:n]
    v = data.cache[pages, 1].flatten(0, 1)[:n]
    start = max(qo[b], qo[b + 1] - CHECK_ROWS)
    return slice(start, qo[b + 1]), data.q[start : qo[b + 1]], k, v


def decoy_pulls(case, data, outputs: dict) -> tuple[dict[str, float], float]:
    """Per output name, its pull towards the decoy (see the module doc), and the references'
    relative gap; ``({}, 0.0)`` for a row without a decoy or pieces. Outputs not shaped like
    the row's queries are left out (the cross-check reports them); a non-finite one gets
    ``inf``."""
    if case is None or data is None:
        return {}, 0.0
    decoy = decoy_variant(case.variant.stdlib)
    if decoy is None:
        return {}, 0.0
    variant = load_variant(case.variant.stdlib)
    shape = tuple(data.q.shape)
    names = [n for n, out in outputs.items() if tuple(out.shape) == shape]
    cross = dict.fromkeys(names, 0.0)
    spread = scale = 0.0
    for rows, q, k, v in pieces(case, data, variant):
        args = (q.float(), k.float(), v.float())
        ref = variant.reference(*args, **data.params)
        delta = decoy.reference(*args, **data.params) - ref
        spread += float(delta.square().sum())
        scale += float(ref.square().sum())
        for name in names:
            cross[name] += float(((outputs[name][rows].float() - ref) * delta).sum())
    if spread == 0.0:
        return {}, 0.0
    pulls = {n: c / spread if math.isfinite(c) else math.inf for n, c in cross.items()}
    return pulls, math.sqrt(spread / max(scale, 1e-30))


def decoy_verdicts(case, data, outputs: dict) -> dict[str, tuple[float, str]]:
    """Per output name, ``(pull, reason)``: reason is '' when the output is nearer the row's
    reference than its decoy, else why it is a mismatch. Empty when the row has no decoy or
    its references are closer than ``DECOY_MIN_GAP``."""
    pulls, gap = decoy_pulls(case, data, outputs)
    if gap < DECOY_MIN_GAP:
        return {}
    label = f"{case.variant.stdlib} without its score transform"
    out = {}
    for name, pull in pulls.items():
        wrong = not pull < DECOY_SPLIT
        reason = f"nearer {label} than the row's variant (pull {pull:.2f})" if wrong else ""
        out[name] = (pull, reason)
    return out
