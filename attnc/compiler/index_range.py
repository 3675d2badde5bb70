"""Owns: the static range check of tensor indices.

The kernels read a tensor param without a bounds check where its indices are proven inside
their dims, and through one (0 outside the shape, as the reference reads it) elsewhere. This
pass bounds every index with intervals whose ends are integers or a size plus an integer
(``num_qo_heads - 1``), using what a read's guards establish (the branch of a
``?:``, the right side of ``&&`` / ``||``: the kernels never make a read those rule out). An
index that lies outside its dim wherever it is read (``sinks[num_qo_heads]``) is an error; a
read with an index the bounds cannot keep inside its dim (``doc[kv_idx]`` for a
``[num_qo_heads]`` tensor) is a warning, and :func:`proven_loads` leaves it out, so the code
generators check it. The first index of a batch-flattened tensor follows the stricter rule of
``token_index`` and is not checked here. The intervals are :mod:`attnc.compiler.index_bounds`.

The kernels evaluate the score, the mask and the sink only at keys of the request, so a read
may rely on ``kv_idx < kv_len``: the masks' calls are guarded by it, and a score that reads by
key sees a tail tile's last key past its end (``kScoreReadsByKey``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnc.compiler import ir
from attnc.compiler.index_bounds import Bound, Bounds, Interval, bound_order, guarded, le, shift
from attnc.dsl.errors import AttnError, Diagnostic, Loc, warning

MAX_VISITS = 20000
"""(expression, guard facts) pairs the check follows before it drops the guards."""


class _TooManyPaths(Exception):
    """More than :data:`MAX_VISITS` (expression, guard facts) pairs to follow."""


@dataclass(frozen=True)
class _Finding:
    """An index of ``load`` (position ``k``) not proven inside its dim where it is read:
    ``outside`` when it is outside its dim there, whatever the sizes; ``guarded`` when
    guards stand between the read and the root."""

    load: ir.TensorLoad
    k: int
    outside: bool
    guarded: bool
    message: str
    loc: Loc


def check_indices(v: ir.VariantIR) -> list[Diagnostic]:
    """The warnings for ``v``'s indices that may leave their dims (the kernels check those
    reads); raises the first index outside its dim wherever it is read, unguarded."""
    findings = _findings(v)
    for f in findings:
        if f.outside and not f.guarded:
            raise AttnError(f.loc, f.message)
    warned: set[tuple[int, int]] = set()
    found = []
    for f in findings:
        if (id(f.load), f.k) not in warned:
            warned.add((id(f.load), f.k))
            found.append(warning(f.loc, f.message))
    return found


def proven_loads(v: ir.VariantIR) -> frozenset[ir.Expr]:
    """The reads of ``v`` whose every index is proven inside its dim wherever it is read:
    the code generators read these plainly and every other read through a bounds check (0
    outside the shape), so a read they derive in another form is checked too."""
    return frozenset(_loads(v)) - frozenset(checked_loads(v))


def proven_without_guards(v: ir.VariantIR, loads: Iterable[ir.Expr]) -> frozenset[ir.Expr]:
    """Those of ``loads`` (reads of ``v``'s tensors) whose every index is inside its dim with
    no guard's help: safe to read plainly wherever the kernels evaluate ``v``'s expressions (at
    keys of the request), ahead of any guard, as a kernel that reads a key's values once for
    every row does (``V::key_values``)."""
    decls = {p.name: p for p in v.params if p.kind == "tensor"}
    bounds = Bounds(follow_guards=False)
    fallback = v.loc or Loc(v.file, 1, 1)
    return frozenset(
        e
        for e in loads
        if isinstance(e, ir.TensorLoad)
        and e.name in decls
        and not any(_check_load(e, decls[e.name], bounds.no_facts, bounds, fallback))
    )


def checked_loads(v: ir.VariantIR) -> list[ir.TensorLoad]:
    """The distinct reads of ``v`` that are not proven (read through a bounds check), in the
    order of the slots (mask, score, sink, output)."""
    unproven = {f.load for f in _findings(v)}
    return list(dict.fromkeys(n for n in _loads(v) if n in unproven))


def _loads(v: ir.VariantIR) -> list[ir.TensorLoad]:
    return [n for root in _roots(v) for n in ir.walk(root) if isinstance(n, ir.TensorLoad)]


def _roots(v: ir.VariantIR) -> list[ir.Expr]:
    return [e for e in (v.mask, v.score, v.sink, v.output) if e is not None]


def _findings(v: ir.VariantIR) -> list[_Finding]:
    """Every finding of ``v``, by location. A program whose guards make too many paths is
    searched without them (wider bounds: more reads checked, never fewer)."""
    try:
        found = _search(v, Bounds(follow_guards=True))
    except _TooManyPaths:
        found = _search(v, Bounds(follow_guards=False))
    return sorted(found, key=lambda f: (f.loc.line, f.loc.col))


def _search(v: ir.VariantIR, bounds: Bounds) -> list[_Finding]:
    decls = {p.name: p for p in v.params if p.kind == "tensor"}
    fallback = v.loc or Loc(v.file, 1, 1)  # IR built by the compiler carries locations
    found: list[_Finding] = []
    seen: set[tuple[int, int]] = set()
    for root in _roots(v):
        stack: list[tuple[ir.Expr, dict[ir.Expr, Interval]]] = [(root, bounds.no_facts)]
        while stack:
            e, facts = stack.pop()
            if (id(e), id(facts)) in seen:
                continue
            seen.add((id(e), id(facts)))
            if len(seen) > MAX_VISITS and bounds.follow_guards:
                raise _TooManyPaths
            if isinstance(e, ir.TensorLoad) and e.name in decls:
                found.extend(_check_load(e, decls[e.name], facts, bounds, fallback))
            stack.extend(_children_with_facts(e, facts, bounds))
    return found


def _children_with_facts(e: ir.Expr, facts, bounds: Bounds):
    if isinstance(e, ir.Select):
        return [
            (e.cond, facts),
            (e.a, guarded(facts, e.cond, True, bounds)),
            (e.b, guarded(facts, e.cond, False, bounds)),
        ]
    if isinstance(e, ir.Binary) and e.op in ("&&", "||"):
        return [(e.a, facts), (e.b, guarded(facts, e.a, e.op == "&&", bounds))]
    return [(c, facts) for c in ir.children(e)]


def _check_load(e: ir.TensorLoad, decl: ir.ParamDecl, facts, bounds: Bounds, fallback: Loc):
    for k, (index, dim) in enumerate(zip(e.indices, decl.dims, strict=True)):
        if k == 0 and decl.token_dim is not None:
            continue  # token_index's rule
        size: Bound = (None, dim) if isinstance(dim, int) else (str(dim), 0)
        last = shift(size, -1)
        r = bounds.of(index, facts)
        loc = index.loc or e.loc or fallback
        where = f"index {k + 1} of '{decl.name}'"
        span = f"its dim {_text(size)} (0 .. {_text(last)})"
        above = [lo for lo in r.lo if le(size, lo)]
        below = [h for h in r.hi if le(h, (None, -1))]
        if above or below:
            how = f"at least {_text(above[0])}" if above else f"at most {_text(below[0])}"
            message = f"{where} is outside {span} wherever it is read: it is {how}"
            if facts:
                message += " (it is read only where its guards hold, and reads 0 there)"
            yield _Finding(e, k, True, bool(facts), message, loc)
            continue
        low_ok = any(le((None, 0), lo) for lo in r.lo)
        high_ok = any(le(h, last) for h in r.hi)
        if low_ok and high_ok:
            continue
        why = []
        if not low_ok:
            why.append("may be negative")
        if not high_ok:
            reach = sorted(r.hi, key=bound_order)
            why.append(f"may reach {_text(reach[0])}" if reach else "has no upper bound")
        yield _Finding(
            e,
            k,
            False,
            bool(facts),
            f"{where} may fall outside {span}: it {' and '.join(why)}; the kernels check "
            "this read (0 outside the shape, a compare per index): keep the index inside "
            f"(a guard such as 'i < {_text(size)} ? t[i] : 0', or min/max) to drop the check",
            loc,
        )


def _text(b: Bound) -> str:
    size, k = b
    if size is None:
        return str(k)
    if k == 0:
        return size
    return f"{size} {'+' if k > 0 else '-'} {abs(k)}"
