"""Owns: intervals of i32 expressions for the tensor-index check (``index_range``).

An interval's ends are integers or a size plus an integer (``num_qo_heads - 1``); each end is a
set of candidate bounds, every one of them sound, so narrowing by a guard adds candidates and a
proof needs one that suffices. :class:`Bounds` evaluates an expression's interval under a set
of guard facts (what the branch of a ``?:`` or the right side of ``&&`` / ``||`` establishes).
i32 arithmetic wraps, so an operation whose result may leave i32 gives no bounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnc.compiler import ir
from attnc.dsl.limits import I32_MAX, I32_MIN, MAX_KV_TOKENS, MAX_QUERY_TOKENS

Bound = tuple[str | None, int]
"""``(size, k)``: the value ``size + k``, or ``k`` when ``size`` is None."""

SIZE_MIN = {
    "num_qo_heads": 1,
    "num_kv_heads": 1,
    "head_dim": 1,
    "kv_len": 1,
    "q_len": 1,
    "batch_size": 1,
}
"""The least value of each size a bound may name (a request reads tensors only when it has a
query and a key)."""

SIZE_MAX = {
    "num_qo_heads": 2**30 - 1,
    "num_kv_heads": 2**30 - 1,
    "head_dim": 256,
    "kv_len": MAX_KV_TOKENS,
    "q_len": MAX_QUERY_TOKENS,
    "batch_size": 2**31 - 1,
}
"""The largest value of each size (the runtime's checks: head counts below 2**30, a request's
KV at most MAX_KV_TOKENS and its queries at most MAX_QUERY_TOKENS, so ``kv_idx + 8`` and
``q_pos - 8`` cannot wrap)."""

_LIMIT = 2**30
"""Integer parts beyond this are dropped: i32 arithmetic wraps, so a bound near the ends of
the i32 range would not be sound."""
_MAX_CANDIDATES = 4
MAX_FACT_SETS = 256
"""Distinct sets of guard facts the check follows (nested guards could make exponentially
many)."""


@dataclass(frozen=True)
class Interval:
    """Sound lower and upper bounds of an i32 value; an empty set means unbounded."""

    lo: frozenset[Bound] = frozenset()
    hi: frozenset[Bound] = frozenset()

    def meet(self, other: Interval) -> Interval:
        """Both intervals hold: every candidate of either is a bound."""
        return Interval(_cap(self.lo | other.lo), _cap(self.hi | other.hi))


UNBOUNDED = Interval()


def _cap(bounds: Iterable[Bound | None]) -> frozenset[Bound]:
    """``bounds`` without the unrepresentable ones, at most :data:`_MAX_CANDIDATES`, numeric
    bounds first."""
    kept = sorted({b for b in bounds if b is not None and _representable(b)}, key=bound_order)
    return frozenset(kept[:_MAX_CANDIDATES])


def bound_order(b: Bound) -> tuple[int, str, int]:
    """A sort key: numeric bounds first, then by size and integer part."""
    return (0 if b[0] is None else 1, b[0] or "", b[1])


def _representable(b: Bound) -> bool:
    size, k = b
    if size is None:
        return I32_MIN <= k <= I32_MAX
    return -_LIMIT <= k <= _LIMIT


def _exact(b: Bound) -> Interval:
    return Interval(frozenset([b]), frozenset([b]))


def number(k: int) -> Interval:
    """The interval of the constant ``k``."""
    return _exact((None, k))


def le(a: Bound, b: Bound) -> bool:
    """Whether ``a <= b`` holds for every value of the sizes."""
    (sa, ka), (sb, kb) = a, b
    if sa == sb:
        return ka <= kb
    if sa is None and sb is not None:
        return ka <= SIZE_MIN[sb] + kb
    if sa == "num_kv_heads" and sb == "num_qo_heads":
        return ka <= kb
    return False


def shift(b: Bound, k: int) -> Bound:
    """``b + k``."""
    return (b[0], b[1] + k)


def _plus(a: Bound, b: Bound, upper: bool) -> Bound | None:
    """A bound of a sum from bounds of its terms (``upper``: of the largest value). Two sizes
    give a number, from their largest (or least) values."""
    if a[0] is None or b[0] is None:
        return (a[0] or b[0], a[1] + b[1])
    ends = SIZE_MAX if upper else SIZE_MIN
    return (None, ends[a[0]] + ends[b[0]] + a[1] + b[1])


def _minus(a: Bound, b: Bound) -> Bound | None:
    if b[0] is None:
        return (a[0], a[1] - b[1])
    if a[0] == b[0]:
        return (None, a[1] - b[1])
    return None


# i32 calls whose value is one of their arguments' values.
_PICKS_AN_ARGUMENT = frozenset({"min", "max", "clamp"})


def _unwrapped(v: Interval) -> Interval:
    """``v`` when its ends keep the value inside i32 for every size (so the arithmetic that
    made it did not wrap), else unbounded."""
    low = any(k + (SIZE_MIN[s] if s else 0) >= I32_MIN for s, k in v.lo)
    high = any(k + (SIZE_MAX[s] if s else 0) <= I32_MAX for s, k in v.hi)
    return v if low and high else UNBOUNDED


def _numbers(bounds: frozenset[Bound]) -> list[int]:
    return [k for s, k in bounds if s is None]


def _lower_of_either(a: frozenset[Bound], b: frozenset[Bound]) -> frozenset[Bound]:
    """Lower bounds of a value that is one of two values with lower bounds ``a`` and ``b``."""
    return _cap(x if le(x, y) else y for x in a for y in b if le(x, y) or le(y, x))


def _upper_of_either(a: frozenset[Bound], b: frozenset[Bound]) -> frozenset[Bound]:
    return _cap(y if le(x, y) else x for x in a for y in b if le(x, y) or le(y, x))


def _nonnegative(v: Interval) -> bool:
    return any(le((None, 0), b) for b in v.lo)


class Bounds:
    """Intervals of i32 expressions under a set of guard facts (node -> extra bounds)."""

    def __init__(self, follow_guards: bool) -> None:
        self.follow_guards = follow_guards
        self._memo: dict[tuple[int, int], Interval] = {}
        self._facts: dict[frozenset, dict[ir.Expr, Interval]] = {frozenset(): {}}
        self._differences: dict[tuple[ir.Expr, ir.Expr], ir.Expr] = {}
        self._guards: dict[tuple[int, int, bool], tuple[ir.Expr, dict[ir.Expr, Interval]]] = {}

    def guard(
        self, facts: dict[ir.Expr, Interval], cond: ir.Expr, holds: bool
    ) -> dict[ir.Expr, Interval]:
        """``guarded``'s answer, once per (facts, cond, holds). Where both sides of ``cond``
        hold (or both fail) the left side's answer is the start, so the prefixes of a chain
        ``c1 && c2 && ... && cn`` (each the guard of the next term) are learned once each,
        not once per later term (which made a chain quadratic)."""
        key = (id(facts), id(cond), holds)  # facts are interned and cond kept: ids stay put
        hit = self._guards.get(key)
        if hit is not None:
            return hit[1]
        if isinstance(cond, ir.Binary) and cond.op in ("&&", "||") and (cond.op == "&&") == holds:
            found = dict(self.guard(facts, cond.a, holds))
            _learn(found, facts, cond.b, holds, self, set())
        else:
            found = dict(facts)
            _learn(found, facts, cond, holds, self, set())
        result = self.interned(found, facts)
        self._guards[key] = (cond, result)
        return result

    def difference(self, a: ir.Expr, b: ir.Expr) -> ir.Expr:
        """The node ``a - b``, one per pair and kept alive: the memo is keyed by node ids,
        which a freed node's successor could take over."""
        key = (a, b)
        found = self._differences.get(key)
        if found is None:
            found = self._differences[key] = ir.Binary("-", a, b, ir.I32)
        return found

    @property
    def no_facts(self) -> dict[ir.Expr, Interval]:
        """The empty set of facts (a read no guard stands over)."""
        return self._facts[frozenset()]

    def interned(
        self, facts: dict[ir.Expr, Interval], before: dict[ir.Expr, Interval]
    ) -> dict[ir.Expr, Interval]:
        """The one dict with the contents of ``facts`` (memo keys use its id); ``before`` once
        :data:`MAX_FACT_SETS` sets are known (guards then narrow nothing more: wider bounds,
        so at most more warnings)."""
        key = frozenset(facts.items())
        found = self._facts.get(key)
        if found is None:
            if len(self._facts) >= MAX_FACT_SETS:
                return before
            found = self._facts[key] = facts
        return found

    def of(self, e: ir.Expr, facts: dict[ir.Expr, Interval]) -> Interval:
        """The interval of i32 ``e`` where ``facts`` (an interned set) hold."""
        key = (id(e), id(facts))
        found = self._memo.get(key)
        if found is None:
            found = self._own(e, facts)
            extra = facts.get(e)
            if extra is not None:
                found = found.meet(extra)
            self._memo[key] = found
        return found

    def _own(self, e: ir.Expr, facts: dict[ir.Expr, Interval]) -> Interval:
        if isinstance(e, ir.Const):
            return number(int(e.value)) if e.type == ir.I32 else UNBOUNDED
        if isinstance(e, ir.Builtin):
            return builtin_interval(e.name)
        if isinstance(e, ir.Unary) and e.op == "neg":
            x = self.of(e.x, facts)
            negated = Interval(
                _cap((None, -k) for k in _numbers(x.hi)), _cap((None, -k) for k in _numbers(x.lo))
            )
            return _unwrapped(negated)
        if isinstance(e, ir.Binary) and e.type == ir.I32:
            if e.op == "-" and e.a == e.b:
                return number(0)  # x - x is 0 in i32 too
            known = _position_difference(e)
            if known is not None:
                return known
            return _unwrapped(self._binary(e.op, self.of(e.a, facts), self.of(e.b, facts)))
        if isinstance(e, ir.Select):
            a = self.of(e.a, guarded(facts, e.cond, True, self))
            b = self.of(e.b, guarded(facts, e.cond, False, self))
            return Interval(_lower_of_either(a.lo, b.lo), _upper_of_either(a.hi, b.hi))
        if isinstance(e, ir.Call) and e.type == ir.I32:
            found = self._call(e.fn, [self.of(a, facts) for a in e.args])
            # min, max and clamp return one of their arguments, so no value wraps and one
            # known end is kept (min(w, 7) <= 7 for any w); abs(-2**31) wraps.
            return found if e.fn in _PICKS_AN_ARGUMENT else _unwrapped(found)
        return UNBOUNDED

    def _binary(self, op: str, a: Interval, b: Interval) -> Interval:
        if op == "+":
            return Interval(
                _cap(_plus(x, y, False) for x in a.lo for y in b.lo),
                _cap(_plus(x, y, True) for x in a.hi for y in b.hi),
            )
        if op == "-":
            return Interval(
                _cap(_minus(x, y) for x in a.lo for y in b.hi),
                _cap(_minus(x, y) for x in a.hi for y in b.lo),
            )
        if op == "*":
            return _times(a, b)
        if op == "/":
            return _divided(a, b)
        if op == "%":
            return _remainder(a, b)
        return UNBOUNDED

    def _call(self, fn: str, args: list[Interval]) -> Interval:
        if fn == "min":
            a, b = args
            return Interval(_lower_of_either(a.lo, b.lo), _cap(a.hi | b.hi))
        if fn == "max":
            a, b = args
            return Interval(_cap(a.lo | b.lo), _upper_of_either(a.hi, b.hi))
        if fn == "clamp":
            x, low, high = args
            raised = Interval(_cap(x.lo | low.lo), _upper_of_either(x.hi, low.hi))
            return Interval(_lower_of_either(raised.lo, high.lo), _cap(raised.hi | high.hi))
        if fn == "abs":
            x = args[0]
            if _nonnegative(x):
                return x
            lows = _numbers(x.lo)
            his = [h for h in x.hi if lows and le((None, -min(lows)), h)]
            his += [(None, max(-min(lows), k)) for k in _numbers(x.hi)] if lows else []
            return Interval(frozenset([(None, 0)]), _cap(his))
        return UNBOUNDED


def _times(a: Interval, b: Interval) -> Interval:
    """A product, bounded where one side is a known number or both are numeric intervals."""
    ca, cb = _constant(a), _constant(b)
    if cb is None and ca is not None:
        a, cb = b, ca
    if cb is not None:
        if cb == 0:
            return number(0)
        if cb == 1:
            return a
        lo = [(None, k * cb) for k in _numbers(a.lo)]
        hi = [(None, k * cb) for k in _numbers(a.hi)]
        return Interval(_cap(lo), _cap(hi)) if cb > 0 else Interval(_cap(hi), _cap(lo))
    ends = [_numbers(a.lo), _numbers(a.hi), _numbers(b.lo), _numbers(b.hi)]
    if not all(ends):
        return UNBOUNDED
    corners = [x * y for x in (max(ends[0]), min(ends[1])) for y in (max(ends[2]), min(ends[3]))]
    return Interval(_cap([(None, min(corners))]), _cap([(None, max(corners))]))


def _constant(v: Interval) -> int | None:
    lo, hi = _numbers(v.lo), _numbers(v.hi)
    if lo and hi and max(lo) == min(hi):
        return max(lo)
    return None


def _divided(a: Interval, b: Interval) -> Interval:
    """A quotient truncated toward zero, bounded for a non-negative dividend and a positive
    constant divisor: it lies between 0 and the dividend."""
    c = _constant(b)
    if c is None or c <= 0 or not _nonnegative(a):
        return UNBOUNDED
    lo = [(None, k // c) for k in _numbers(a.lo) if k >= 0] + [(None, 0)]
    hi = [(None, k // c) for k in _numbers(a.hi)] + [h for h in a.hi if h[0] is not None]
    return Interval(_cap(lo), _cap(hi))


def _remainder(a: Interval, b: Interval) -> Interval:
    """A remainder truncated toward zero: below the divisor's size, with the dividend's sign
    (and no larger than a non-negative dividend)."""
    if not any(le((None, 1), x) for x in b.lo):
        return UNBOUNDED  # the divisor may be zero or negative
    below = [shift(h, -1) for h in b.hi]
    if _nonnegative(a):
        return Interval(frozenset([(None, 0)]), _cap(below + list(a.hi)))
    return Interval(_cap((None, 1 - k) for k in _numbers(b.hi)), _cap(below))


_BUILTINS: dict[str, tuple[Bound, Bound]] = {
    "qo_head": ((None, 0), ("num_qo_heads", -1)),
    "kv_head": ((None, 0), ("num_kv_heads", -1)),
    "kv_idx": ((None, 0), ("kv_len", -1)),
    "q_idx": ((None, 0), ("q_len", -1)),
    # kv_len - q_len + q_idx: negative for the first rows when q_len > kv_len
    "q_pos": ((None, 1 - MAX_QUERY_TOKENS), ("kv_len", -1)),
    "batch": ((None, 0), ("batch_size", -1)),
    "num_qo_heads": (("num_qo_heads", 0), ("num_qo_heads", 0)),
    "num_kv_heads": (("num_kv_heads", 0), ("num_kv_heads", 0)),
    "head_dim": (("head_dim", 0), ("head_dim", 0)),
    "kv_len": (("kv_len", 0), ("kv_len", 0)),
    "q_len": (("q_len", 0), ("q_len", 0)),
}


def builtin_interval(name: str) -> Interval:
    """The range of an i32 built-in over every request, head and row."""
    ends = _BUILTINS.get(name)
    if ends is None:
        return UNBOUNDED
    lo, hi = ends
    return Interval(frozenset([lo]), frozenset([hi]))


# Differences of two positions, which the ends above cannot give (q_pos's least value moves
# with kv_len - q_len): from q_idx in [0, q_len), kv_idx in [0, kv_len) and q_pos = q_idx +
# kv_len - q_len, the least value (from the size limits) and the largest.
_LEAST_BY_Q, _LEAST_BY_KV = 1 - MAX_QUERY_TOKENS, 1 - MAX_KV_TOKENS
_POSITION_DIFFERENCES: dict[tuple[str, str], tuple[int, Bound]] = {
    ("q_pos", "kv_idx"): (_LEAST_BY_Q, ("kv_len", -1)),  # from 1 - q_len
    ("kv_idx", "q_pos"): (_LEAST_BY_KV, ("q_len", -1)),  # from 1 - kv_len
    ("q_pos", "q_idx"): (_LEAST_BY_Q, ("kv_len", -1)),  # kv_len - q_len
    ("q_idx", "q_pos"): (_LEAST_BY_KV, ("q_len", -1)),  # q_len - kv_len
    ("kv_idx", "q_idx"): (_LEAST_BY_Q, ("kv_len", -1)),  # from 1 - q_len
    ("q_idx", "kv_idx"): (_LEAST_BY_KV, ("q_len", -1)),  # from 1 - kv_len
}


def _position_difference(e: ir.Binary) -> Interval | None:
    """The range of ``e`` when it is one position minus another."""
    if e.op != "-" or not isinstance(e.a, ir.Builtin) or not isinstance(e.b, ir.Builtin):
        return None
    ends = _POSITION_DIFFERENCES.get((e.a.name, e.b.name))
    if ends is None:
        return None
    return Interval(frozenset([(None, ends[0])]), frozenset([ends[1]]))


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def guarded(
    facts: dict[ir.Expr, Interval], cond: ir.Expr, holds: bool, bounds: Bounds
) -> dict[ir.Expr, Interval]:
    """``facts`` plus what ``cond`` being ``holds`` says about i32 values (a new dict)."""
    if not bounds.follow_guards:
        return facts
    return bounds.guard(facts, cond, holds)


def _learn(found, facts, cond: ir.Expr, holds: bool, bounds: Bounds, seen: set) -> None:
    # A condition shared by several places of the DAG (a let or def used twice) is learned
    # once: narrowing is an intersection, so a second visit adds nothing, and visiting every
    # path would cost 2^depth for `let a1 = a0 && a0; let a2 = a1 && a1; ...`.
    if (id(cond), holds) in seen:
        return
    seen.add((id(cond), holds))
    if isinstance(cond, ir.Unary) and cond.op == "not":
        _learn(found, facts, cond.x, not holds, bounds, seen)
    elif isinstance(cond, ir.Binary) and cond.op in ("&&", "||"):
        if (cond.op == "&&") == holds:  # both sides hold, or both fail
            _learn(found, facts, cond.a, holds, bounds, seen)
            _learn(found, facts, cond.b, holds, bounds, seen)
    elif isinstance(cond, ir.Binary) and cond.op in _NEGATED and cond.a.type == ir.I32:
        op = cond.op if holds else _NEGATED[cond.op]
        a, b = bounds.of(cond.a, facts), bounds.of(cond.b, facts)
        for left, right, rel, other in ((cond.a, cond.b, op, b), (cond.b, cond.a, _FLIPPED[op], a)):
            _narrow(found, left, rel, other)
            x, c = _offset(left)
            if c and bounds.of(left, bounds.no_facts) != UNBOUNDED:
                # x + c did not wrap, so x rel other - c (kv_idx + 8 < 16: kv_idx < 8)
                _narrow(found, x, rel, _shifted(other, -c))
            _narrow_difference(found, left, right, rel, bounds)


def _narrow_difference(found, left: ir.Expr, right: ir.Expr, rel: str, bounds: Bounds) -> None:
    """``left rel right`` also bounds ``left - right`` against 0 where the subtraction cannot
    wrap. With constant offsets, ``x + c1 rel y + c2`` where neither sum wraps (both have
    bounds) bounds ``x - y`` against ``c2 - c1``: ``kv_idx + 8 > q_pos`` gives
    ``q_pos - kv_idx < 8``."""
    (x, c1), (y, c2) = _offset(left), _offset(right)
    if (c1 or c2) and any(bounds.of(e, bounds.no_facts) == UNBOUNDED for e in (left, right)):
        (x, c1), (y, c2) = (left, 0), (right, 0)
    diff = bounds.difference(x, y)
    if bounds.of(diff, bounds.no_facts) != UNBOUNDED:
        _narrow(found, diff, rel, number(c2 - c1))


def _shifted(v: Interval, k: int) -> Interval:
    """``v + k`` (ends that leave the representable range are dropped)."""
    return Interval(_cap(shift(b, k) for b in v.lo), _cap(shift(b, k) for b in v.hi))


def _offset(e: ir.Expr) -> tuple[ir.Expr, int]:
    """``(x, c)`` with ``e = x + c`` for an i32 constant ``c`` (``(e, 0)`` otherwise), through
    nested offsets: ``(kv_idx + 3) + 5`` gives ``(kv_idx, 8)``. The identity holds where ``e``
    does not wrap; a caller checks that ``e`` has bounds, and then so has every level inside
    it (a constant offset keeps a missing end missing)."""
    total = 0
    while isinstance(e, ir.Binary) and e.op in ("+", "-") and e.type == ir.I32:
        a, b = e.a, e.b
        if isinstance(b, ir.Const):
            total += int(b.value) if e.op == "+" else -int(b.value)
            e = a
        elif isinstance(a, ir.Const) and e.op == "+":
            total += int(a.value)
            e = b
        else:
            break
    return e, total


def _narrow(found, e: ir.Expr, op: str, other: Interval) -> None:
    """Record ``e op other``."""
    if op == "<":
        extra = Interval(hi=_cap(shift(h, -1) for h in other.hi))
    elif op == "<=":
        extra = Interval(hi=other.hi)
    elif op == ">":
        extra = Interval(lo=_cap(shift(lo, 1) for lo in other.lo))
    elif op == ">=":
        extra = Interval(lo=other.lo)
    elif op == "==":
        extra = other
    else:
        return
    found[e] = found[e].meet(extra) if e in found else extra
