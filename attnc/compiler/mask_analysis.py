"""Mask analysis: closed forms for the KV range of a query tile and for tile classes.

A mask that is a conjunction of linear integer inequalities in ``q_idx``/``q_pos``/``kv_idx``
(constant parts may use request-level i32 values: i32 params, ``q_len``, ``kv_len``) becomes a
list of constraints ``cq*q_idx + ck*kv_idx + c >= 0``. Any other mask is opaque: every tile is
PARTIAL and every query may see ``[0, kv_len)``. The analysis is conservative: a tile may be
called PARTIAL when it is really FULL or EMPTY, never the other way round.

Tile queries eliminate ``q_idx`` from the constraints (Fourier-Motzkin over the reals, then
integer rounding), which gives the exact real projection onto ``kv_idx``; a tile is FULL when
every constraint holds at its worst corner. The same algorithm lives in ``attnc/mask_math.cuh``
for the generated ``kv_range``/``classify`` functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import gcd

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate

Atom = ir.Expr
Terms = tuple[tuple[int, Atom], ...]
REQUEST_BUILTINS = ("q_len", "kv_len")


class _Opaque(Exception):
    """Raised inside linearisation when the mask is not a linear conjunction."""


@dataclass(frozen=True)
class _Lin:
    """``cq*q_idx + ck*kv_idx + sum(coef*atom) + offset`` with request-level atoms."""

    cq: int
    ck: int
    terms: Terms
    offset: int

    @property
    def is_int_const(self) -> bool:
        return self.cq == 0 and self.ck == 0 and not self.terms

    @property
    def has_vars(self) -> bool:
        return self.cq != 0 or self.ck != 0

    def scaled(self, s: int) -> _Lin:
        terms = tuple((s * c, a) for c, a in self.terms if s * c != 0)
        return _Lin(s * self.cq, s * self.ck, terms, s * self.offset)

    def plus(self, other: _Lin) -> _Lin:
        acc: dict[Atom, int] = {}
        for c, a in self.terms + other.terms:
            acc[a] = acc.get(a, 0) + c
        terms = tuple((c, a) for a, c in acc.items() if c != 0)
        return _Lin(self.cq + other.cq, self.ck + other.ck, terms, self.offset + other.offset)


@dataclass(frozen=True)
class LinearConstraint:
    """``cq*q_idx + ck*kv_idx + c >= 0`` where ``c = sum(coef*atom) + offset``."""

    cq: int
    ck: int
    terms: Terms
    offset: int

    @property
    def c(self) -> ir.Expr:
        """The constant part as a request-level i32 IR expression."""
        return _terms_expr(self.terms, self.offset)

    def c_value(self, env: Mapping[str, int]) -> int:
        """The constant part evaluated with ``env`` (q_len, kv_len, i32 params)."""
        return self.offset + sum(c * int(evaluate(a, env)) for c, a in self.terms)

    def describe(self) -> str:
        parts = [f"{self.cq}*q_idx", f"{self.ck}*kv_idx"]
        parts += [f"{c}*{_atom_text(a)}" for c, a in self.terms]
        parts.append(str(self.offset))
        return " + ".join(parts) + " >= 0"


@dataclass(frozen=True)
class MaskAnalysis:
    """Result of :func:`analyse_mask`. ``kind`` is ``none``, ``linear`` or ``opaque``."""

    kind: str
    constraints: tuple[LinearConstraint, ...] = ()
    reason: str = ""

    def describe(self) -> str:
        """One line for ``attnc compile --emit opt``."""
        if self.kind == "none":
            return "none: no mask"
        if self.kind == "opaque":
            return f"opaque: {self.reason}"
        n = len(self.constraints)
        body = "; ".join(c.describe() for c in self.constraints)
        return f"linear: {n} constraint{'s' if n != 1 else ''}" + (f" [{body}]" if body else "")


# ---------------------------------------------------------------------------------------------
# Linearisation


def analyse_mask(mask: ir.Expr | None) -> MaskAnalysis:
    """Analyse a bool IR mask (None = no mask); see the module docstring."""
    if mask is None:
        return MaskAnalysis("none")
    try:
        found = _conjuncts(mask, negated=False)
    except _Opaque as err:
        return MaskAnalysis("opaque", reason=str(err))
    return MaskAnalysis("linear", _normalise(found))


def _conjuncts(e: ir.Expr, negated: bool) -> list[LinearConstraint]:
    """Constraints whose conjunction equals ``e`` (or ``not e`` when ``negated``)."""
    if isinstance(e, ir.Const) and e.type == ir.BOOL:
        holds = bool(e.value) != negated
        return [] if holds else [LinearConstraint(0, 0, (), -1)]
    if isinstance(e, ir.Unary) and e.op == "not":
        return _conjuncts(e.x, not negated)
    if isinstance(e, ir.Binary) and e.op in ir.LOGICAL:
        if (e.op == "&&") == negated:
            raise _Opaque("uses ||" if e.op == "||" else "uses a negated &&")
        return _conjuncts(e.a, negated) + _conjuncts(e.b, negated)
    if isinstance(e, ir.Binary) and e.op in ir.COMPARISONS:
        return _comparison(e, negated)
    raise _Opaque(f"uses {_node_name(e)} as a condition")


_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _comparison(e: ir.Binary, negated: bool) -> list[LinearConstraint]:
    if e.a.type != ir.I32 or e.b.type != ir.I32:
        raise _Opaque(f"compares {e.a.type} values")
    op = _NEGATE[e.op] if negated else e.op
    d = _linear(e.a).plus(_linear(e.b).scaled(-1))  # a - b
    if op == "!=":
        raise _Opaque("uses != on indices")
    forms = {
        ">=": [d],
        ">": [d.plus(_Lin(0, 0, (), -1))],
        "<=": [d.scaled(-1)],
        "<": [d.scaled(-1).plus(_Lin(0, 0, (), -1))],
        "==": [d, d.scaled(-1)],
    }[op]
    return [LinearConstraint(f.cq, f.ck, f.terms, f.offset) for f in forms]


def _linear(e: ir.Expr) -> _Lin:
    """Linear form of an i32 expression, or raise :class:`_Opaque`."""
    if e.type != ir.I32:
        raise _Opaque(f"uses a {e.type} value")
    if isinstance(e, ir.Const):
        return _Lin(0, 0, (), int(e.value))
    if isinstance(e, ir.Builtin):
        return _builtin(e)
    if isinstance(e, ir.ParamRef):
        return _Lin(0, 0, ((1, e),), 0)
    if isinstance(e, ir.Unary) and e.op == "neg":
        return _linear(e.x).scaled(-1)
    if isinstance(e, ir.Cast) and e.x.type == ir.I32:
        return _linear(e.x)
    if isinstance(e, ir.Binary) and e.op in ("+", "-"):
        b = _linear(e.b)
        return _linear(e.a).plus(b if e.op == "+" else b.scaled(-1))
    if isinstance(e, ir.Binary) and e.op == "*":
        return _product(_linear(e.a), _linear(e.b))
    raise _Opaque(f"uses {_node_name(e)}")


def _builtin(e: ir.Builtin) -> _Lin:
    if e.name == "q_idx":
        return _Lin(1, 0, (), 0)
    if e.name == "kv_idx":
        return _Lin(0, 1, (), 0)
    if e.name == "q_pos":  # q_idx + kv_len - q_len
        return _Lin(1, 0, ((1, _req("kv_len")), (-1, _req("q_len"))), 0)
    if e.name in REQUEST_BUILTINS:
        return _Lin(0, 0, ((1, e),), 0)
    raise _Opaque(f"uses {e.name}")


def _product(a: _Lin, b: _Lin) -> _Lin:
    if a.is_int_const:
        return b.scaled(a.offset)
    if b.is_int_const:
        return a.scaled(b.offset)
    if a.has_vars or b.has_vars:
        raise _Opaque("has a non-constant coefficient")
    atom = ir.Binary("*", _terms_expr(a.terms, a.offset), _terms_expr(b.terms, b.offset), ir.I32)
    return _Lin(0, 0, ((1, atom),), 0)


def _normalise(found: list[LinearConstraint]) -> tuple[LinearConstraint, ...]:
    """Drop trivially true and duplicate constraints, reduce by the gcd, spot false ones."""
    out: list[LinearConstraint] = []
    for con in found:
        if con.cq == 0 and con.ck == 0 and not con.terms:
            if con.offset < 0:
                return (LinearConstraint(0, 0, (), -1),)
            continue
        g = gcd(con.cq, con.ck)
        if not con.terms and g > 1:
            con = LinearConstraint(con.cq // g, con.ck // g, (), con.offset // g)
        if con not in out:
            out.append(con)
    return tuple(out)


def _req(name: str) -> ir.Builtin:
    return ir.Builtin(name, ir.I32)


def _terms_expr(terms: Terms, offset: int) -> ir.Expr:
    expr: ir.Expr | None = None
    for c, a in terms:
        term = a if c == 1 else ir.Binary("*", ir.Const(c, ir.I32), a, ir.I32)
        expr = term if expr is None else ir.Binary("+", expr, term, ir.I32)
    if expr is None:
        return ir.Const(offset, ir.I32)
    if offset == 0:
        return expr
    return ir.Binary("+", expr, ir.Const(offset, ir.I32), ir.I32)


def _node_name(e: ir.Expr) -> str:
    if isinstance(e, ir.Binary):
        return e.op
    if isinstance(e, ir.Unary):
        return "not" if e.op == "not" else "negation"
    if isinstance(e, ir.Call):
        return f"{e.fn}()"
    if isinstance(e, (ir.Builtin, ir.ParamRef)):
        return f"{e.type} {e.name}"
    if isinstance(e, ir.TensorLoad):
        return f"tensor {e.name}"
    return type(e).__name__.lower()


def _atom_text(a: Atom) -> str:
    if isinstance(a, (ir.Builtin, ir.ParamRef)):
        return a.name
    if isinstance(a, ir.Const):
        return str(a.value)
    if isinstance(a, ir.Binary):
        return f"({_atom_text(a.a)} {a.op} {_atom_text(a.b)})"
    return _node_name(a)


# ---------------------------------------------------------------------------------------------
# Evaluation (mirrors attnc/mask_math.cuh)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _bound(a: int, c: int, lo: int, hi: int) -> tuple[int, int]:
    """Intersect ``[lo, hi]`` with the integer solutions of ``a*k + c >= 0``."""
    if a > 0:
        return max(lo, _ceil_div(-c, a)), hi
    if a < 0:
        return lo, min(hi, c // -a)
    return (lo, hi) if c >= 0 else (max(lo, 1), min(hi, 0))


def _project(cons: list[tuple[int, int, int]], q_lo: int, q_hi: int, lo: int, hi: int):
    """Narrow ``[lo, hi]`` to kv values some real q in ``[q_lo, q_hi]`` allows."""
    if q_lo > q_hi:
        return 1, 0
    lower = [(1, 0, -q_lo)] + [x for x in cons if x[0] > 0]
    upper = [(-1, 0, q_hi)] + [x for x in cons if x[0] < 0]
    for cq_l, ck_l, c_l in lower:
        for cq_u, ck_u, c_u in upper:
            a, b = cq_l, -cq_u
            lo, hi = _bound(a * ck_u + b * ck_l, a * c_u + b * c_l, lo, hi)
    for cq, ck, c in cons:
        if cq == 0:
            lo, hi = _bound(ck, c, lo, hi)
    return lo, hi


def _values(analysis: MaskAnalysis, env: Mapping[str, int]) -> list[tuple[int, int, int]]:
    return [(x.cq, x.ck, x.c_value(env)) for x in analysis.constraints]


def kv_range(
    analysis: MaskAnalysis, q_begin: int, q_end: int, env: Mapping[str, int]
) -> tuple[int, int]:
    """Half-open kv range any query of ``[q_begin, q_end)`` may see, clipped to
    ``[0, kv_len)``; ``(0, 0)`` when empty."""
    kv_len = int(env["kv_len"])
    if analysis.kind != "linear":
        return (0, kv_len) if q_begin < q_end and kv_len > 0 else (0, 0)
    lo, hi = _project(_values(analysis, env), q_begin, q_end - 1, 0, kv_len - 1)
    return (lo, hi + 1) if lo <= hi else (0, 0)


def classify(
    analysis: MaskAnalysis, q0: int, q1: int, k0: int, k1: int, env: Mapping[str, int]
) -> str:
    """Class of the tile ``[q0, q1) x [k0, k1)``: ``empty``, ``full`` or ``partial``.

    The tile must lie inside the valid range: ``0 <= q0 < q1 <= q_len`` and
    ``0 <= k0 < k1 <= kv_len`` (the kernels clip tiles before asking).
    """
    if q0 >= q1 or k0 >= k1:
        return "empty"
    if analysis.kind == "none":
        return "full"
    if analysis.kind == "opaque":
        return "partial"
    cons = _values(analysis, env)
    lo, hi = _project(cons, q0, q1 - 1, k0, k1 - 1)
    if lo > hi:
        return "empty"
    for cq, ck, c in cons:
        worst = cq * (q0 if cq >= 0 else q1 - 1) + ck * (k0 if ck >= 0 else k1 - 1) + c
        if worst < 0:
            return "partial"
    return "full"


# ---------------------------------------------------------------------------------------------
# C++ emission

RenderExpr = Callable[[ir.Expr], str]


def _render_c(con: LinearConstraint, render_expr: RenderExpr) -> str:
    out = f"{con.offset}LL"
    for c, a in con.terms:
        out += f" + {c}LL * static_cast<long long>({render_expr(a)})"
    return out


def _render_constraints(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    rows = [
        f"      {{{x.cq}LL, {x.ck}LL, {_render_c(x, render_expr)}}}," for x in analysis.constraints
    ]
    n = len(rows)
    return f"const attnc::LinearConstraint cons[{n}] = {{\n" + "\n".join(rows) + "\n  };\n"


def render_kv_range(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``KvRange kv_range(int q_idx_begin, int q_idx_end) const``."""
    kv_len = render_expr(_req("kv_len"))
    if analysis.kind != "linear" or not analysis.constraints:
        return f"return attnc::full_kv_range(q_idx_begin, q_idx_end, {kv_len});"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis, render_expr)
        + f"  return attnc::linear_kv_range(cons, {n}, q_idx_begin, q_idx_end, {kv_len});"
    )


def render_classify(analysis: MaskAnalysis, render_expr: RenderExpr) -> str:
    """Body of ``TileClass classify(int q_idx0, int q_idx1, int kv0, int kv1) const``."""
    if analysis.kind == "opaque":
        return "return attnc::opaque_classify(q_idx0, q_idx1, kv0, kv1);"
    if analysis.kind == "none" or not analysis.constraints:
        return "return attnc::unmasked_classify(q_idx0, q_idx1, kv0, kv1);"
    n = len(analysis.constraints)
    return (
        _render_constraints(analysis, render_expr)
        + f"  return attnc::linear_classify(cons, {n}, q_idx0, q_idx1, kv0, kv1);"
    )
