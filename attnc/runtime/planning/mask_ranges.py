"""The planner's view of a variant's mask: the KV range each query tile may see, when the mask
analysis can compute it from the request's lengths and the params given to ``plan()``.

The planners read it as rows (``RangeProgram``, built here by ``tile_range_program``) that one
C++ evaluation (``attnc/kernels/host/mask_range_rows.h``) turns into the range of every query
tile (prefill) or the span of every request (decode): the one implementation of the range
algorithm the runtime runs. ``attnc.compiler.mask_tiles.kv_range`` answers the same question
for one tile in plain Python; the numpy oracle the C++ evaluation is tested against lives in
``tests/mask_ranges_oracle.py``. ``PlannedMask`` is what ``plan(params=...)`` decided: the
rows (None: every tile may see its whole KV) and the values ``run()`` must be given again.
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.mask_analysis import LinearConstraint, MaskAnalysis
from attnc.runtime.checks.params import check_plan_params
from attnc.runtime.planning.host_planner_abi import (
    PR_C0,
    PR_CK,
    PR_COLUMNS,
    PR_CQ,
    PR_EXTRA,
    PR_KV_LEN,
    PR_Q_LEN,
    PR_TERM,
)
from attnc.runtime.planning.plan_params import MaskReads, plan_value, variant_mask_reads
from attnc.runtime.planning.tensor_stamps import TensorStamp, check_planned_tensors
from attnc.runtime.value_keys import same_number, value_key

if TYPE_CHECKING:  # annotations only: the planners need no import of the variant module
    from attnc.runtime.variant import Variant


def plan_time_bounds(
    analysis: MaskAnalysis,
    params: Mapping[str, object] | None,
    batch_tensors: Mapping[str, np.ndarray] | None,
) -> tuple[dict[str, int], dict[str, np.ndarray], tuple[tuple[LinearConstraint, ...], ...]] | None:
    """The i32 params known at plan time, the per-request tensors, and the mask's conjunctions
    of linear bounds, or None when the mask has no such bounds or they read something not
    known at plan time (every tile may then see the whole KV)."""
    known = {k: int(v) for k, v in (params or {}).items() if isinstance(v, numbers.Integral)}
    per_req = dict(batch_tensors or {})
    if analysis.kind not in ("linear", "union") or not _atoms_known(analysis, known, per_req):
        return None
    return known, per_req, analysis.conjunctions


@dataclass(frozen=True)
class RangeProgram:
    """The mask's KV ranges as rows for the host planners (``mask_range_rows.h``, columns
    ``host_planner_abi.PR_*``): per constraint (conjunction index, -1 for a wrap guard) ``cq``,
    ``ck`` and its constant ``c0 + a_q * q_len + a_kv * kv_len``; what a constant reads
    besides the lengths and the plan-time scalars (a per-request tensor ``window[batch]``, an
    atom evaluated per request) it takes from a column of ``extra(q_lens, kv_lens)``, added."""

    rows: np.ndarray  # int64 [n, PR_COLUMNS]
    num_terms: int
    by_request: tuple[LinearConstraint, ...]  # what each extra column sums, per request
    params: Mapping[str, int]
    per_req: Mapping[str, np.ndarray]
    rows_ptr: int = 0  # the address of ``rows`` (set on creation)
    # An extra column reads q_len or kv_len (else ``extra`` needs only the batch size).
    reads_lengths: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows_ptr", self.rows.ctypes.data)
        lengths = any(
            isinstance(n, ir.Builtin) and n.name in ("q_len", "kv_len")
            for x in self.by_request
            for _, atom in x.terms
            for n in ir.walk(atom)
        )
        object.__setattr__(self, "reads_lengths", lengths)

    def extra(self, q_lens: np.ndarray, kv_lens: np.ndarray) -> np.ndarray | None:
        """int64 ``[columns, batch]``: the extra columns per request (None: none)."""
        if not self.by_request:
            return None
        return np.stack(
            [
                constants_per_request(x, q_lens, kv_lens, self.params, self.per_req)
                for x in self.by_request
            ]
        )


def tile_range_program(
    analysis: MaskAnalysis,
    params: Mapping[str, object] | None = None,
    batch_tensors: Mapping[str, np.ndarray] | None = None,
) -> RangeProgram | None:
    """The ``RangeProgram`` of the mask with the plan-time ``params`` (i32 values; others are
    ignored) and ``batch_tensors`` (host int64 arrays ``[batch]`` of the ``batch_size``
    tensors the bounds read as ``t[batch]``): the rows of the prefill planner's tiles and of
    the decode step's requests. None when every tile may see the whole KV (no mask, an opaque
    mask, or one whose bounds read a param not given)."""
    bounds = plan_time_bounds(analysis, params, batch_tensors)
    if bounds is None:
        return None
    known, per_req, terms = bounds
    tagged = [(i, x) for i, cons in enumerate(terms) for x in cons]
    tagged += [(-1, g) for g in analysis.wrap_guards]
    rows: list[list[int]] = []
    by_request: list[LinearConstraint] = []
    for term, x in tagged:
        c0, a_q, a_kv, rest = _split_constant(x, known)
        column = -1
        if rest is not None:
            column = len(by_request)
            by_request.append(rest)
        rows.append(_range_row(term, x, (c0, a_q, a_kv), column))
    table = np.ascontiguousarray(np.array(rows, dtype=np.int64).reshape(-1, PR_COLUMNS))
    return RangeProgram(table, len(terms), tuple(by_request), known, per_req)


def _range_row(
    term: int, x: LinearConstraint, constant: tuple[int, int, int], column: int
) -> list[int]:
    """One row (columns ``PR_*``) of constraint ``x`` of conjunction ``term``, its constant
    ``(c0, a_q, a_kv)`` (``_split_constant``) plus extra column ``column`` (-1: none)."""
    row = [0] * PR_COLUMNS
    row[PR_TERM], row[PR_CQ], row[PR_CK], row[PR_EXTRA] = term, x.cq, x.ck, column
    row[PR_C0], row[PR_Q_LEN], row[PR_KV_LEN] = constant
    return row


def _split_constant(
    x: LinearConstraint, params: Mapping[str, int]
) -> tuple[int, int, int, LinearConstraint | None]:
    """``(c0, a_q, a_kv, rest)`` with ``x``'s constant ``c0 + a_q*q_len + a_kv*kv_len`` plus
    the constant of ``rest`` (its atoms other than q_len, kv_len and ``params``; None when
    there are none). When a folded value leaves int64 the whole constant is ``rest``."""
    c0, a_q, a_kv = x.offset, 0, 0
    others = []
    for coef, atom in x.terms:
        if isinstance(atom, ir.Builtin) and atom.name == "q_len":
            a_q += coef
        elif isinstance(atom, ir.Builtin) and atom.name == "kv_len":
            a_kv += coef
        elif isinstance(atom, ir.ParamRef) and atom.name in params:
            c0 += coef * int(params[atom.name])
        else:
            others.append((coef, atom))
    if any(not -(2**63) <= v < 2**63 for v in (c0, a_q, a_kv)):
        return 0, 0, 0, x
    rest = dataclasses.replace(x, terms=tuple(others), offset=0) if others else None
    return c0, a_q, a_kv, rest


_PLANNED_MASKS = 16  # plan-time param values remembered per variant
_MEMO_LOCK = threading.Lock()  # guards the per-variant memos' writes (threads share a variant)
_MISSING = object()
_T = TypeVar("_T")


def _remember(memo: dict, key: object, value: _T) -> _T:
    """Put ``value`` in a per-variant ``memo`` of at most ``_PLANNED_MASKS`` entries, dropping
    the oldest first, and return what the memo holds for ``key`` (another thread's value when
    it was first). Writes hold a lock, as every thread planning the variant shares the memo;
    reads (``dict.get``) need none."""
    with _MEMO_LOCK:
        found = memo.get(key, _MISSING)
        if found is not _MISSING:
            return found
        while len(memo) >= _PLANNED_MASKS:
            memo.pop(next(iter(memo)))
        memo[key] = value
        return value


@dataclass(frozen=True)
class PlannedMask:
    """What ``plan(params=...)`` decided about the mask: its KV ranges as the host planner's
    rows (``program``; None: unknown, every tile may see its whole KV) and the param values
    given to ``plan()``, which ``run()`` must be given again (scalars: equal values;
    tensors the mask reads: the same tensor, unchanged)."""

    values: Mapping[str, object]
    tensors: Mapping[str, TensorStamp] = field(default_factory=dict)
    program: RangeProgram | None = None

    @staticmethod
    def from_values(
        variant: Variant,
        scalars: Mapping[str, object],
        tensors: Mapping[str, torch.Tensor],
        *,
        tile_map: bool = False,
    ) -> PlannedMask:
        """From checked plan values with tensors (``plan_params.split_plan_params``): the
        ``batch_size`` tensors the bounds read feed the KV ranges per request; every tensor
        the mask reads is stamped for ``run()``, and with ``tile_map`` (the prefill plan
        builds one from these values) every scalar it reads too. Not remembered (tensor
        values change)."""
        names, per_request = bound_names(variant)
        bound = {k: v for k, v in scalars.items() if k in names}
        per_req = {
            k: t.detach().to("cpu", torch.int64).numpy()
            for k, t in tensors.items()
            if k in per_request
        }
        analysis = variant.compiled.mask_analysis
        if per_req:
            program = tile_range_program(analysis, bound, per_req)
        else:
            program = _closed_form(variant, bound)
        reads = variant_mask_reads(variant)
        stamps = {k: TensorStamp.of(t) for k, t in tensors.items() if k in reads.params}
        kept = dict(bound) if program is not None else {}
        if tile_map:
            kept.update(_map_scalars(variant, reads, scalars, tensors))
        return PlannedMask(_with_given(kept, scalars), stamps, program)

    @staticmethod
    def from_plan_params(variant: Variant, params: Mapping[str, object]) -> PlannedMask:
        """Check the params given to ``plan()`` (scalars only): the mask's bounds are
        planned with those they read, and ``run()`` must be given every one again.
        Remembered per variant and values (a decode step plans every token)."""
        try:
            key = tuple(sorted((k, *value_key(v)) for k, v in params.items()))
            hash(key)
        except TypeError:  # an unhashable value: checked (and refused) below, not remembered
            return PlannedMask._checked(variant, params)
        memo = variant.memo.planned_masks
        found = memo.get(key)
        if found is None:
            found = _remember(memo, key, PlannedMask._checked(variant, params))
        return found

    @staticmethod
    def _checked(variant: Variant, params: Mapping[str, object]) -> PlannedMask:
        decls = variant.params
        given = check_plan_params(decls, params, variant_name=variant.name)
        analysis = variant.compiled.mask_analysis
        names = mask_bound_params(analysis)
        bound = {k: v for k, v in given.items() if k in names}
        # run() must be given every checked scalar again (those the bounds read among them)
        return PlannedMask(dict(given), program=tile_range_program(analysis, bound))

    def check_run(self, variant_name: str, values: Mapping[str, object]) -> None:
        """Raise a ``ValueError`` when ``run()`` gets other values than the plan was made for
        (the work list was cut for them) or another tensor than a planned one."""
        check_planned_tensors(variant_name, self.tensors, values)
        for name, planned in self.values.items():
            if not same_number(values[name], planned):
                raise ValueError(
                    f"variant '{variant_name}': param '{name}' is {values[name]!r} in run(), "
                    f"but plan() was given {planned!r}; give run() the values given to "
                    "plan() (the work list is cut, and a tile map built, for them), or call "
                    "plan() again with the new value"
                )


def _with_given(kept: Mapping[str, object], given: Mapping[str, object]) -> dict[str, object]:
    """The scalars ``run()`` must be given again: those the plan used (``kept``) and every
    other scalar given to ``plan()``. A value given to plan() and not to run() would
    otherwise be checked and dropped, and run() would take the param's default without a
    word (soft-cap's ``cap``, say, given as FlashInfer's plan() takes its soft-cap)."""
    out = dict(given)
    out.update(kept)
    return out


def _map_scalars(
    variant: Variant,
    reads: MaskReads,
    scalars: Mapping[str, object],
    tensors: Mapping[str, torch.Tensor],
) -> dict[str, object]:
    """The scalars a mask that reads per-token tensors reads, as plan() builds its tile map
    with them (``prefill_tile_map.map_values``: given, or the default): the map's EMPTY and
    FULL blocks hold for these values only, so ``run()`` must be given them again. Empty
    when no map is built (a param the mask reads is not known at plan time)."""
    if not reads.needs_tile_map:
        return {}
    out: dict[str, object] = {}
    for decl in variant.params:
        if decl.name not in reads.params:
            continue
        value = plan_value(decl, scalars, tensors)
        if value is None:
            return {}
        if decl.kind != "tensor":
            out[decl.name] = value
    return out


def bound_names(variant: Variant) -> tuple[frozenset[str], frozenset[str]]:
    """(params the mask's bounds read, those of them that are ``batch_size`` tensors),
    remembered in the variant's memo."""
    found = variant.memo.bound_names
    if found is None:
        names = mask_bound_params(variant.compiled.mask_analysis)
        per_request = frozenset(
            d.name
            for d in variant.params
            if d.kind == "tensor" and d.dims == ("batch_size",) and d.name in names
        )
        found = variant.memo.bound_names = (names, per_request)
    return found


def _closed_form(variant: Variant, bound: Mapping[str, object]) -> RangeProgram | None:
    """``tile_range_program`` of checked scalar ``bound`` values, remembered per variant and
    values (the same values give the same program object)."""
    key = tuple(sorted((k, *value_key(v)) for k, v in bound.items()))
    memo: dict = variant.memo.closed_form_ranges
    found = memo.get(key, _MISSING)  # None (no ranges) is remembered too
    if found is _MISSING:
        analysis = variant.compiled.mask_analysis
        found = _remember(memo, key, tile_range_program(analysis, bound))
    return found


NO_PLANNED_MASK = PlannedMask({})


def mask_bound_params(analysis: MaskAnalysis) -> frozenset[str]:
    """Names of the params the mask's linear bounds read (empty for other masks)."""
    names: set[str] = set()
    for cons in analysis.conjunctions:
        for x in cons:
            for _, atom in x.terms:
                names.update(
                    n.name for n in ir.walk(atom) if isinstance(n, ir.ParamRef | ir.TensorLoad)
                )
    return frozenset(names)


def constants_per_request(
    x: LinearConstraint,
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    params: Mapping[str, int],
    per_req: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """``x.c_value`` for every request (int64 [batch]). Atoms that are q_len, kv_len, a param
    or a ``batch_size`` tensor read ``t[batch]`` are evaluated on whole arrays; any other atom
    per request, with ``evaluate``."""
    per_req = per_req or {}
    columns = {
        "q_len": np.asarray(q_lens, dtype=np.int64),
        "kv_len": np.asarray(kv_lens, dtype=np.int64),
    }
    c = np.full(columns["kv_len"].shape, x.offset, dtype=np.int64)
    for coef, atom in x.terms:
        if isinstance(atom, ir.Builtin) and atom.name in columns:
            c += coef * columns[atom.name]
        elif isinstance(atom, ir.ParamRef) and atom.name in params:
            c += coef * int(params[atom.name])
        elif isinstance(atom, ir.TensorLoad) and _is_batch_read(atom) and atom.name in per_req:
            c += coef * per_req[atom.name].astype(np.int64)
        else:
            c += coef * np.array(
                [
                    int(
                        evaluate(
                            atom,
                            {**params, "q_len": int(q), "kv_len": int(k), "batch": b},
                            per_req,
                        )
                    )
                    for b, (q, k) in enumerate(zip(q_lens, kv_lens, strict=True))
                ],
                dtype=np.int64,
            )
    return c


def _is_batch_read(atom: ir.Expr) -> bool:
    """``t[batch]``: a read of a per-request tensor at the request's index."""
    return (
        isinstance(atom, ir.TensorLoad)
        and len(atom.indices) == 1
        and isinstance(atom.indices[0], ir.Builtin)
        and atom.indices[0].name == "batch"
    )


def _atoms_known(
    analysis: MaskAnalysis, params: Mapping[str, int], per_req: Mapping[str, np.ndarray]
) -> bool:
    """True when every atom of the bounds reads only q_len, kv_len, batch, ``params`` and the
    per-request tensors ``per_req``."""
    guards = tuple(analysis.wrap_guards)
    for x in [x for cons in analysis.conjunctions for x in cons] + list(guards):
        for _, atom in x.terms:
            for n in ir.walk(atom):
                if isinstance(n, ir.ParamRef) and n.name not in params:
                    return False
                if isinstance(n, ir.TensorLoad) and not (_is_batch_read(n) and n.name in per_req):
                    return False
                if isinstance(n, ir.Builtin) and n.name not in ("q_len", "kv_len", "batch"):
                    return False
    return True
