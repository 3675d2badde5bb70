"""Mask analysis: closed forms for the KV range of a query tile and for tile classes.

A mask built from linear integer comparisons in ``q_idx``/``q_pos``/``kv_idx`` (constant parts
may use request-level i32 values: i32 params, ``q_len``, ``kv_len``) with ``&&``, ``||`` and
``!`` is normalised to a disjunction of conjunctions (DNF) of constraints
``cq*q_idx + ck*kv_idx + c >= 0``: ``!`` is pushed inward (De Morgan), ``&&`` is distributed over
``||`` and ``!=`` becomes ``<`` or ``>``. A single conjunction is ``linear``; two to
:data:`MAX_DISJUNCTS` conjunctions are a ``union``. Any other mask (a non-linear piece, or more
than :data:`MAX_DISJUNCTS` conjunctions at any step of the normalisation) is opaque: every tile
is PARTIAL and every query may see ``[0, kv_len)``; so is a mask whose tile math would
leave 64-bit integers (:mod:`attnc.compiler.mask_int64`). The analysis is conservative: a
tile may be called PARTIAL when it is really FULL or EMPTY, never the other way round.

Tile queries eliminate ``q_idx`` from the constraints (Fourier-Motzkin over the reals, then
integer rounding), which gives the exact real projection onto ``kv_idx``; a tile is FULL when
every constraint holds at its worst corner. A union's KV range is the hull of its terms'
ranges; a union tile is FULL when some term calls it FULL, EMPTY when every term calls it
EMPTY, else PARTIAL.

A comparison that reads a tensor per row or per element (``doc[kv_idx] == doc[q_pos]``, a
``kv_len``/``q_len`` tensor of language v2) cannot be decided in closed form: it becomes a
data literal, replaced by true in the normalised form. The conjunctions around it still bound
the KV range and EMPTY tiles (true over-approximates the mask, ``!`` having been pushed down
to the literals), and ``reads_data`` is set, so no tile is called FULL. A request-level i32
tensor read (``window[batch]`` of a ``batch_size`` tensor) is a per-request constant atom,
like an i32 param. The tile questions are answered in Python by
:mod:`attnc.compiler.mask_tiles` (the KV range; the tests hold the tile class) and in the
generated C++ by ``attnc/mask_math.cuh``, whose calls :mod:`attnc.codegen.mask_cuda` emits.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from math import gcd

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.hoist import level
from attnc.compiler.mask_int64 import analysis_fits, form_fits
from attnc.compiler.mask_split import split_comparison
from attnc.dsl.limits import I32_MAX, I32_MIN, MAX_KV_TOKENS, MAX_QUERY_TOKENS

Atom = ir.Expr
Terms = tuple[tuple[int, Atom], ...]
Conjunction = tuple["LinearConstraint", ...]
REQUEST_BUILTINS = ("q_len", "kv_len")
MAX_DISJUNCTS = 4  # most conjunctions a union may have (checked after every step)
# Most comparisons split by abs/min/max/clamp in one analysis: each split doubles the cases,
# and calls nested through shared lets made the analysis run for hours.
MAX_SPLITS = 256
TOO_LARGE = "has coefficients too large for 64-bit tile math"


class _Opaque(Exception):
    """Raised inside normalisation when the mask is not a small union of linear conjunctions."""


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

    def c_value(self, env: Mapping[str, int], tensors: Mapping[str, object] | None = None) -> int:
        """The constant part evaluated with ``env`` (q_len, kv_len, i32 params; ``batch``
        too when an atom reads a per-request tensor, whose values ``tensors`` holds)."""
        return self.offset + sum(c * int(evaluate(a, env, tensors)) for c, a in self.terms)

    def describe(self) -> str:
        """The constraint as text, ``cq*q_idx + ck*kv_idx + ... + offset >= 0``."""
        parts = [f"{self.cq}*q_idx", f"{self.ck}*kv_idx"]
        parts += [f"{c}*{_atom_text(a)}" for c, a in self.terms]
        parts.append(str(self.offset))
        return " + ".join(parts) + " >= 0"


@dataclass(frozen=True)
class MaskAnalysis:
    """Result of :func:`analyse_mask`. ``kind`` is ``none``, ``linear``, ``union`` or ``opaque``.

    ``constraints`` is the conjunction of a ``linear`` mask; ``terms`` holds the conjunctions
    (two or more, each with at least one constraint) of a ``union``.
    """

    kind: str
    constraints: Conjunction = ()
    reason: str = ""
    terms: tuple[Conjunction, ...] = ()
    # Linear forms of the mask's i32 arithmetic that may wrap for some params: where one of
    # them can leave the i32 range over a request, the tile answers are those of an opaque
    # mask (the constraints assume exact arithmetic). Each is ``cq*q_idx + ck*kv_idx + c``.
    wrap_guards: Conjunction = ()
    # True when comparisons reading per-row or per-element tensor values were replaced by
    # true: the constraints over-approximate the mask, so no tile may be called FULL.
    reads_data: bool = False

    @property
    def conjunctions(self) -> tuple[Conjunction, ...]:
        """The conjunctions of a ``linear`` or ``union`` mask, whose union is the mask: a
        union's ``terms``, a linear mask's ``constraints`` alone; none for other kinds."""
        if self.kind == "union":
            return self.terms
        return (self.constraints,) if self.kind == "linear" else ()

    def describe(self) -> str:
        """One line for ``attnc compile --emit opt``."""
        if self.kind == "none":
            return "none: no mask"
        if self.kind == "opaque":
            return f"opaque: {self.reason}"
        guards = "; reads data: no tile is FULL" if self.reads_data else ""
        if self.wrap_guards:
            forms = "; ".join(g.describe().removesuffix(" >= 0") for g in self.wrap_guards)
            guards += f"; opaque where i32 wraps: [{forms}]"
        if self.kind == "union":
            body = "; ".join(_describe_linear(t) for t in self.terms)
            return f"union of {len(self.terms)}: {body}{guards}"
        return _describe_linear(self.constraints) + guards


def _describe_linear(cons: Conjunction) -> str:
    n = len(cons)
    body = "; ".join(c.describe() for c in cons)
    return f"linear: {n} constraint{'s' if n != 1 else ''}" + (f" [{body}]" if body else "")


# ---------------------------------------------------------------------------------------------
# Linearisation


_FALSE = LinearConstraint(0, 0, (), -1)


def analyse_mask(mask: ir.Expr | None) -> MaskAnalysis:
    """Analyse a bool IR mask (None = no mask); see the module docstring."""
    if mask is None:
        return MaskAnalysis("none")
    token = _DNF_MEMO.set({})
    lin_token = _LIN_MEMO.set({})
    guards_token = _GUARDS.set({})
    data_token = _DATA.set([])
    splits_token = _SPLITS.set([0])
    try:
        dnf = _dnf(mask, negated=False)
        guards = tuple(g for g in _GUARDS.get() if not never_wraps(g))
        data = bool(_DATA.get())
        if not analysis_fits(dnf, guards):
            raise _Opaque(TOO_LARGE)
    except _Opaque as err:
        return MaskAnalysis("opaque", reason=str(err))
    finally:
        _DNF_MEMO.reset(token)
        _LIN_MEMO.reset(lin_token)
        _GUARDS.reset(guards_token)
        _DATA.reset(data_token)
        _SPLITS.reset(splits_token)
    if not dnf:  # false in exact arithmetic; where the i32 arithmetic wraps it may be true
        return MaskAnalysis("linear", (_FALSE,), wrap_guards=guards, reads_data=data)
    if len(dnf) == 1:
        return MaskAnalysis("linear", dnf[0], wrap_guards=guards, reads_data=data)
    return MaskAnalysis("union", terms=tuple(dnf), wrap_guards=guards, reads_data=data)


# The data literals met during one analysis (comparisons replaced by true).
_DATA: ContextVar[list[ir.Expr]] = ContextVar("data_literals")

# The number of comparisons split during one analysis (a one-element list).
_SPLITS: ContextVar[list[int]] = ContextVar("splits")

# (id(node), negated) -> (node, result) during one analysis: shared sub-masks once.
_DNF_MEMO: ContextVar[dict[tuple[int, bool], tuple[ir.Expr, list[Conjunction]]]] = ContextVar(
    "dnf_memo"
)

# id(node) -> (node, linear form) during one analysis: shared i32 sub-expressions once.
_LIN_MEMO: ContextVar[dict[int, tuple[ir.Expr, _Lin]]] = ContextVar("linear_memo")


def _dnf(e: ir.Expr, negated: bool) -> list[Conjunction]:
    """Conjunctions whose disjunction equals ``e`` (or ``not e`` when ``negated``).

    Every conjunction is normalised and satisfiable as far as :func:`_normalise` can tell; no
    conjunction's constraints include another's (that one would be redundant). ``[]`` is
    false, ``[()]`` is true.
    """
    memo = _DNF_MEMO.get()
    found = memo.get((id(e), negated))
    if found is None:
        found = (e, _dnf_node(e, negated))
        memo[(id(e), negated)] = found
    return found[1]


def _dnf_node(e: ir.Expr, negated: bool) -> list[Conjunction]:
    if isinstance(e, ir.Const) and e.type == ir.BOOL:
        return [()] if bool(e.value) != negated else []
    if isinstance(e, ir.Unary) and e.op == "not":
        return _dnf(e.x, not negated)
    if isinstance(e, ir.Binary) and e.op in ir.LOGICAL:
        a, b = _dnf(e.a, negated), _dnf(e.b, negated)
        if (e.op == "&&") != negated:  # a conjunction: distribute
            return _prune([_normalise(list(x + y)) for x in a for y in b])
        return _prune(a + b)
    if isinstance(e, ir.Binary) and e.op in ir.COMPARISONS:
        if reads_row_data(e):
            _DATA.get().append(e)
            return [()]  # unknown in closed form: true over-approximates either polarity
        split = split_comparison(e, _NEGATE[e.op] if negated else e.op)
        if split is not None:
            _count_split()
            return _dnf(split, negated=False)
        return _prune([_normalise(f) for f in _comparison(e, negated)])
    raise _Opaque(f"uses {_node_name(e)} as a condition")


def _count_split() -> None:
    """One more split comparison; past :data:`MAX_SPLITS` the mask is opaque."""
    splits = _SPLITS.get()
    splits[0] += 1
    if splits[0] > MAX_SPLITS:
        raise _Opaque(f"splits abs/min/max/clamp into more than {MAX_SPLITS} cases")


def _prune(dnf: list[Conjunction]) -> list[Conjunction]:
    """Drop false and redundant conjunctions; raise :class:`_Opaque` when too many remain."""
    live = [x for x in dnf if x != (_FALSE,)]
    out: list[Conjunction] = []
    for i, x in enumerate(live):
        # x is redundant when an earlier conjunction's constraints are a subset of x's, or a
        # later one's a strict subset (the first of equal conjunctions stays).
        if not any(
            set(y) <= set(x) and (j < i or set(y) != set(x)) for j, y in enumerate(live) if j != i
        ):
            out.append(x)
    if len(out) > MAX_DISJUNCTS:
        raise _Opaque(f"has more than {MAX_DISJUNCTS} disjuncts")
    return out


_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _comparison(e: ir.Binary, negated: bool) -> list[list[LinearConstraint]]:
    """The comparison as a disjunction of conjunctions (only ``!=`` has two)."""
    if e.a.type != ir.I32 or e.b.type != ir.I32:
        raise _Opaque(f"compares {e.a.type} values")
    op = _NEGATE[e.op] if negated else e.op
    d = _linear(e.a).plus(_linear(e.b).scaled(-1))  # a - b
    greater = d.plus(_Lin(0, 0, (), -1))
    less = d.scaled(-1).plus(_Lin(0, 0, (), -1))
    forms = {
        ">=": [[d]],
        ">": [[greater]],
        "<=": [[d.scaled(-1)]],
        "<": [[less]],
        "==": [[d, d.scaled(-1)]],
        "!=": [[less], [greater]],
    }[op]
    return [[LinearConstraint(f.cq, f.ck, f.terms, f.offset) for f in term] for term in forms]


def _linear(e: ir.Expr) -> _Lin:
    """Linear form of an i32 expression, or raise :class:`_Opaque`; a sub-expression shared
    through lets is analysed once (its wrap guard is remembered then), so a chain of lets
    that each use the one before twice costs its length, not its unfolded tree's size."""
    memo = _LIN_MEMO.get()
    found = memo.get(id(e))
    if found is None:
        found = (e, _linear_node(e))
        memo[id(e)] = found
    return found[1]


def _linear_node(e: ir.Expr) -> _Lin:
    if e.type != ir.I32:
        raise _Opaque(f"uses a {e.type} value")
    if isinstance(e, ir.Const):
        return _Lin(0, 0, (), int(e.value))
    if isinstance(e, ir.Builtin):
        return _builtin(e)
    if isinstance(e, ir.ParamRef):
        return _Lin(0, 0, ((1, e),), 0)
    if isinstance(e, ir.TensorLoad) and level(e) == ir.REQUEST:
        return _Lin(0, 0, ((1, e),), 0)  # e.g. window[batch]: one value per request
    if isinstance(e, ir.Unary) and e.op == "neg":
        return _guarded(_linear(e.x).scaled(-1))
    if isinstance(e, ir.Cast) and e.x.type == ir.I32:
        return _linear(e.x)
    if isinstance(e, ir.Binary) and e.op in ("+", "-"):
        b = _linear(e.b)
        return _guarded(_linear(e.a).plus(b if e.op == "+" else b.scaled(-1)))
    if isinstance(e, ir.Binary) and e.op == "*":
        return _guarded(_product(_linear(e.a), _linear(e.b)))
    raise _Opaque(f"uses {_node_name(e)}")


# The linear forms of the i32 arithmetic met during one analysis (see wrap_guards).
_GUARDS: ContextVar[dict[LinearConstraint, None]] = ContextVar("wrap_guards")
# Longest q_len / kv_len the static no-wrap proof assumes: the longest the runtime takes
# (forms with params are checked at run time whatever the length).
MAX_LEN = max(MAX_KV_TOKENS, MAX_QUERY_TOKENS)


def _guarded(form: _Lin) -> _Lin:
    """``form`` (the value of an i32 arithmetic node), remembered as a wrap guard; one whose
    wrap check leaves int64 makes the mask opaque at once (a chain of lets whose
    coefficients grow stops there)."""
    guard = LinearConstraint(form.cq, form.ck, form.terms, form.offset)
    if not form_fits(guard):
        raise _Opaque(TOO_LARGE)
    _GUARDS.get().setdefault(guard)
    return form


def never_wraps(g: LinearConstraint) -> bool:
    """Whether ``g`` stays in the i32 range for every request: true when its only atoms are
    q_len and kv_len and its extremes over 0 <= q_idx < q_len <= MAX_LEN and
    0 <= kv_idx < kv_len <= MAX_LEN (the corners of two triangles) fit."""
    coef = {"q_len": 0, "kv_len": 0}
    for c, atom in g.terms:
        if not (isinstance(atom, ir.Builtin) and atom.name in coef):
            return False
        coef[atom.name] += c
    top = MAX_LEN
    q_corners = [g.cq * i + coef["q_len"] * n for i, n in ((0, 1), (0, top), (top - 1, top))]
    k_corners = [g.ck * i + coef["kv_len"] * n for i, n in ((0, 1), (0, top), (top - 1, top))]
    low = g.offset + min(q_corners) + min(k_corners)
    high = g.offset + max(q_corners) + max(k_corners)
    return I32_MIN <= low and high <= I32_MAX


def reads_row_data(e: ir.Expr) -> bool:
    """Whether ``e`` reads a tensor at a row- or element-level index (remembered per node)."""
    return ir.bottom_up(e, "_row_data", _own_row_data)


def _own_row_data(e: ir.Expr) -> bool:
    own = isinstance(e, ir.TensorLoad) and level(e) > ir.REQUEST
    return own or any(c.__dict__["_row_data"] for c in ir.children(e))


def wraps(
    g: LinearConstraint, env: Mapping[str, int], tensors: Mapping[str, object] | None = None
) -> bool:
    """Whether ``g`` may leave the i32 range over the request described by ``env``."""
    c = g.c_value(env, tensors)
    q_top, k_top = max(int(env["q_len"]) - 1, 0), max(int(env["kv_len"]) - 1, 0)
    low = c + min(0, g.cq * q_top) + min(0, g.ck * k_top)
    high = c + max(0, g.cq * q_top) + max(0, g.ck * k_top)
    return low < I32_MIN or high > I32_MAX


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
    if not (_i32_literals(a) and _i32_literals(b)):
        raise _Opaque(TOO_LARGE)  # the product's factors are printed as i32 expressions
    atom = ir.Binary("*", _terms_expr(a.terms, a.offset), _terms_expr(b.terms, b.offset), ir.I32)
    return _Lin(0, 0, ((1, atom),), 0)


def _i32_literals(form: _Lin) -> bool:
    """Whether the coefficients and offset of ``form`` are i32 values."""
    return all(I32_MIN <= v <= I32_MAX for v in (form.offset, *(c for c, _ in form.terms)))


def _normalise(found: list[LinearConstraint]) -> Conjunction:
    """Drop trivially true and duplicate constraints, reduce by the gcd, spot false ones
    (a false conjunction is ``(_FALSE,)``). Of two constraints that differ only in the
    integer offset, the weaker goes; ``f + a >= 0`` with ``-f + b >= 0`` and ``a + b < 0`` is
    false."""
    out: list[LinearConstraint] = []
    for con in found:
        if con.cq == 0 and con.ck == 0 and not con.terms:
            if con.offset < 0:
                return (_FALSE,)
            continue
        g = gcd(con.cq, con.ck)
        if not con.terms and g > 1:
            con = LinearConstraint(con.cq // g, con.ck // g, (), con.offset // g)
        if con not in out:
            out.append(con)
    tightest: dict[tuple[int, int, Terms], int] = {}
    for x in out:
        form = (x.cq, x.ck, x.terms)
        tightest[form] = min(tightest.get(form, x.offset), x.offset)
    for (cq, ck, terms), offset in tightest.items():
        opposite = tightest.get((-cq, -ck, tuple((-c, a) for c, a in terms)))
        if opposite is not None and offset + opposite < 0:
            return (_FALSE,)
    return tuple(x for x in out if x.offset == tightest[x.cq, x.ck, x.terms])


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
    if isinstance(a, ir.TensorLoad):
        return f"{a.name}[{', '.join(_atom_text(i) for i in a.indices)}]"
    if isinstance(a, ir.Const):
        return str(a.value)
    if isinstance(a, ir.Binary):
        return f"({_atom_text(a.a)} {a.op} {_atom_text(a.b)})"
    return _node_name(a)
