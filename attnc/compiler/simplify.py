"""SymPy simplification of numeric sub-expressions.

Arithmetic (+ - * and f32 /) goes through SymPy, which folds constants and puts sums and
products in a canonical order; everything else (calls, selects, tensor loads, i32 / and %,
casts) becomes an opaque atom whose children are simplified recursively. i32 arithmetic is
arithmetic modulo 2**32 (a ring, so SymPy's identities hold; folded constants are wrapped);
an i32 value converted to f32 stays an atom, so wrapping happens where the source says.
Constants are binary32 values; constant sub-expressions are folded with binary32 rounding,
and ``inf``/``nan`` results stay IEEE constants that SymPy never sees: an arithmetic tree
holding one is left as written (SymPy's real numbers would cancel ``x + inf - inf`` to ``x``
and absorb ``(x + inf) * 0.0`` into ``0``, where IEEE gives ``nan``); nor does a tree whose
folded constant would leave float32's normal range (``x * 1e20 * 1e20``). Division by a
request-level value becomes a multiplication by its reciprocal, which hoisting then moves
out of the inner loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

import sympy

from attnc.compiler import ir
from attnc.compiler.evaluate import evaluate
from attnc.compiler.hoist import level
from attnc.compiler.numeric import F32_MIN_NORMAL, is_finite, round_f32, wrap_i32


def simplify_variant(v: ir.VariantIR) -> ir.VariantIR:
    """``v`` with score, mask, output and sink simplified."""
    return replace(
        v,
        score=_maybe(v.score),
        mask=_maybe(v.mask),
        output=_maybe(v.output),
        sink=_maybe(v.sink),
    )


def _maybe(e: ir.Expr | None) -> ir.Expr | None:
    return None if e is None else simplify_expr(e)


# id(node) -> (node, simplified node) while one top-level simplification runs: a shared
# sub-expression is simplified once and its result stays shared.
_MEMO: ContextVar[dict[int, tuple[ir.Expr, ir.Expr]] | None] = ContextVar(
    "simplify_memo", default=None
)


def simplify_expr(e: ir.Expr) -> ir.Expr:
    """An expression equal to ``e`` (up to float rounding) in canonical, folded form."""
    memo = _MEMO.get()
    if memo is None:
        token = _MEMO.set({})
        shared_token = _SHARED.set(_shared_nodes(e))
        try:
            return simplify_expr(e)
        finally:
            _SHARED.reset(shared_token)
            _MEMO.reset(token)
    found = memo.get(id(e))
    if found is None:
        found = (e, _simplify_node(e))
        memo[id(e)] = found
    return found[1]


# ids of the nodes with two or more parents in the expression being simplified: SymPy sees
# each as one atom (simplified once on its own), so shared parts are converted once.
_SHARED: ContextVar[frozenset[int]] = ContextVar("simplify_shared", default=frozenset())


@contextmanager
def shared_as_atoms(e: ir.Expr) -> Iterator[None]:
    """Within the block, :class:`SympyConverter` reads each sub-expression of ``e`` with two
    or more parents as one atom, as :func:`simplify_expr` does: a DAG then costs SymPy its
    distinct nodes, not its unfolded tree (which doubles with every ``let a = b * (b + 1)``)."""
    token = _SHARED.set(_shared_nodes(e))
    try:
        yield
    finally:
        _SHARED.reset(token)


def _shared_nodes(e: ir.Expr) -> frozenset[int]:
    uses: dict[int, int] = {}
    for node in ir.postorder(e):
        for c in ir.children(node):
            uses[id(c)] = uses.get(id(c), 0) + 1
    return frozenset(i for i, n in uses.items() if n > 1)


def _simplify_node(e: ir.Expr) -> ir.Expr:
    folded = _fold_constant(e)
    if folded is not None:
        return folded
    if e.type == ir.BOOL:
        return _simplify_bool(e)
    if isinstance(e, (ir.Binary, ir.Unary)) or (isinstance(e, ir.Cast) and e.type == ir.F32):
        result = SympyConverter().roundtrip(e)
        return result if result is not None else _simplify_children(e)
    return _simplify_children(e)


def _fold_constant(e: ir.Expr) -> ir.Const | None:
    if isinstance(e, ir.Const) or level(e) != ir.REQUEST or _has_free_leaf(e):
        return None
    try:
        value = evaluate(e, {}, binary32=True)
    except (KeyError, ZeroDivisionError, OverflowError, ValueError):
        return None
    return ir.Const(value, e.type, loc=e.loc)


def _has_free_leaf(e: ir.Expr) -> bool:
    """Whether ``e`` reads a built-in, param or tensor (remembered per node)."""
    return ir.bottom_up(e, "_free", _own_free)


def _own_free(e: ir.Expr) -> bool:
    if isinstance(e, (ir.Builtin, ir.ParamRef, ir.TensorLoad)):
        return True
    return any(c.__dict__["_free"] for c in ir.children(e))


def _simplify_children(e: ir.Expr) -> ir.Expr:
    if isinstance(e, ir.TensorLoad):
        return replace(e, indices=tuple(simplify_expr(i) for i in e.indices))
    if isinstance(e, ir.Unary):
        return replace(e, x=simplify_expr(e.x))
    if isinstance(e, ir.Binary):
        return replace(e, a=simplify_expr(e.a), b=simplify_expr(e.b))
    if isinstance(e, ir.Select):
        return _simplify_select(e)
    if isinstance(e, ir.Call):
        return replace(e, args=tuple(simplify_expr(a) for a in e.args))
    if isinstance(e, ir.Cast):
        return replace(e, x=simplify_expr(e.x))
    return e


def _simplify_select(e: ir.Select) -> ir.Expr:
    cond = simplify_expr(e.cond)
    if isinstance(cond, ir.Const):
        return simplify_expr(e.a if cond.value else e.b)
    return replace(e, cond=cond, a=simplify_expr(e.a), b=simplify_expr(e.b))


def _simplify_bool(e: ir.Expr) -> ir.Expr:
    if isinstance(e, ir.Binary) and e.op in ir.LOGICAL:
        a, b = simplify_expr(e.a), simplify_expr(e.b)
        for x, y in ((a, b), (b, a)):
            if isinstance(x, ir.Const):
                absorbing = e.op == "||"
                if bool(x.value) == absorbing:
                    return ir.Const(absorbing, ir.BOOL, loc=e.loc)
                return y
        if a == b:
            return a
        return replace(e, a=a, b=b)
    if isinstance(e, ir.Unary) and e.op == "not":
        x = simplify_expr(e.x)
        if isinstance(x, ir.Unary) and x.op == "not":
            return x.x
        if isinstance(x, ir.Const):
            return ir.Const(not x.value, ir.BOOL, loc=e.loc)
        return replace(e, x=x)
    return _simplify_children(e)


MAX_POWER = 16  # a SymPy power above this is left as the source wrote it
SYMPY_SPAN = 24  # levels of one expression SymPy rewrites at once


class FormTooLarge(Exception):
    """The SymPy form would be much larger than the IR it came from."""


class NonFiniteConstant(Exception):
    """An arithmetic tree holds an ``inf`` or ``nan`` constant, which SymPy must not see."""


class ConstantOutOfRange(Exception):
    """SymPy combined constants into one that float32 holds only as inf, 0 or a subnormal
    (``score * 1e20 * 1e20`` -> ``inf * score``, NaN at score 0 where the source gives 0)."""


class SympyConverter:
    """IR <-> SymPy for one arithmetic tree."""

    def __init__(self) -> None:
        self.leaves: dict[sympy.Symbol, ir.Expr] = {}
        self.symbols: dict[ir.Expr, sympy.Symbol] = {}
        self._to: dict[int, tuple[ir.Expr, sympy.Expr]] = {}
        self._root: ir.Expr | None = None
        self._from: dict[tuple[sympy.Expr, str], ir.Expr] = {}

    def roundtrip(self, e: ir.Expr) -> ir.Expr | None:
        """``e`` through SymPy and back (simplified), or None when SymPy finds an infinite or
        undefined value, holds an ``inf`` or ``nan`` constant, folds constants into one out of
        float32's normal range, or its form would be much larger than ``e`` (then ``e`` stays
        as written)."""
        self._root = e
        try:
            expr = self.to_sympy(e)
        except NonFiniteConstant:
            return None
        if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return None
        try:
            return self.from_sympy(expr, e.type, e)
        except (FormTooLarge, ConstantOutOfRange):
            return None

    # ------------------------------------------------------------------ IR -> SymPy
    def to_sympy(self, e: ir.Expr) -> sympy.Expr:
        """SymPy form of ``e`` (each distinct node converted once); raises
        :class:`NonFiniteConstant` where ``e`` holds ``inf`` or ``nan``."""
        found = self._to.get(id(e))
        if found is None:
            found = (e, self._to_sympy(e))
            self._to[id(e)] = found
        return found[1]

    def _to_sympy(self, e: ir.Expr) -> sympy.Expr:
        if not isinstance(e, (ir.Const, ir.Builtin, ir.ParamRef)):
            folded = _fold_constant(e)
            if folded is not None:
                e = folded
        if e is not self._root and (id(e) in _SHARED.get() or self._far_below_root(e)):
            return self._atom(e)
        if isinstance(e, ir.Const):
            if e.type == ir.I32:
                return sympy.Integer(int(e.value))
            if not _is_finite_constant(e):
                raise NonFiniteConstant(e.value)  # inf and nan stay IEEE values, never SymPy's
            return sympy.Float(float(e.value), 17)
        if isinstance(e, ir.Unary) and e.op == "neg":
            return -self.to_sympy(e.x)
        if isinstance(e, ir.Binary) and e.op in ("+", "-"):
            return sympy.Add(*self._sum_terms(e))
        if isinstance(e, ir.Binary) and e.op == "*":
            return self.to_sympy(e.a) * self.to_sympy(e.b)
        if isinstance(e, ir.Binary) and e.op == "/" and e.type == ir.F32:
            den = self.to_sympy(e.b)
            if den.is_zero:  # a zero divisor: IEEE division at run time, never SymPy's zoo
                return self._atom(e)
            return self.to_sympy(e.a) / den
        # A cast i32 -> f32 stays an atom: its i32 operand wraps before the conversion, so
        # SymPy must not mix it into f32 arithmetic (its operand is simplified on its own).
        return self._atom(e)

    def _sum_terms(self, e: ir.Binary) -> list[sympy.Expr]:
        """The SymPy terms of the chain of sums and differences whose last node is ``e``,
        walked down its left operands without recursion, each left operand that
        ``to_sympy`` would not take apart (converted before, shared, far below the root, or
        a constant) kept whole. One ``Add`` of them all: adding one term at a time made
        SymPy flatten the growing sum again at every node (quadratic in the terms)."""
        rights: list[sympy.Expr] = []
        node: ir.Expr = e
        while (
            isinstance(node, ir.Binary)
            and node.op in ("+", "-")
            and (node is e or self._takes_apart(node))
        ):
            right = self.to_sympy(node.b)
            rights.append(right if node.op == "+" else -right)
            node = node.a
        return [self.to_sympy(node), *reversed(rights)]

    def _takes_apart(self, e: ir.Expr) -> bool:
        """Whether ``to_sympy`` would convert ``e`` from its operands (the conditions of
        ``_to_sympy``'s first lines, checked the same way)."""
        if id(e) in self._to or id(e) in _SHARED.get() or self._far_below_root(e):
            return False
        return _fold_constant(e) is None

    def _far_below_root(self, e: ir.Expr) -> bool:
        """Whether ``e`` is more than SYMPY_SPAN levels below the converted root (deeper
        parts are simplified on their own, so SymPy's work stays linear in the depth)."""
        root = self._root
        return root is not None and ir.depth(e) < ir.depth(root) - SYMPY_SPAN

    def _atom(self, e: ir.Expr) -> sympy.Expr:
        inner: ir.Expr
        if isinstance(e, (ir.Builtin, ir.ParamRef, ir.Const)):
            inner = e
        elif e is not self._root and (id(e) in _SHARED.get() or self._far_below_root(e)):
            inner = simplify_expr(e)  # simplified once on its own, one atom here
        else:
            inner = _simplify_children(e)
        if isinstance(inner, ir.Const) and not _is_finite_constant(inner):
            raise NonFiniteConstant(inner.value)
        if inner is not e and isinstance(inner, ir.Const):
            return self.to_sympy(inner)
        folded = None if isinstance(inner, ir.Const) else _fold_constant(inner)
        if folded is not None:
            return self.to_sympy(folded)
        if inner in self.symbols:
            return self.symbols[inner]
        name = inner.name if isinstance(inner, (ir.Builtin, ir.ParamRef)) else "t"
        sym = sympy.Symbol(f"{name}_{len(self.leaves)}", integer=inner.type == ir.I32, real=True)
        self.leaves[sym] = inner
        self.symbols[inner] = sym
        return sym

    # ------------------------------------------------------------------ SymPy -> IR
    def from_sympy(self, expr: sympy.Expr, want: str, origin: ir.Expr) -> ir.Expr:
        """IR of ``expr`` with type ``want`` (each distinct SymPy node converted once)."""
        key = (expr, want)
        found = self._from.get(key)
        if found is None:
            found = self._from_sympy(expr, want, origin)
            self._from[key] = found
        return found

    def _from_sympy(self, expr: sympy.Expr, want: str, origin: ir.Expr) -> ir.Expr:
        loc = origin.loc
        if want == ir.F32 and expr.is_integer:
            inner = self.from_sympy(expr, ir.I32, origin)
            if isinstance(inner, ir.Const):
                return ir.Const(float(inner.value), ir.F32, loc=loc)
            return ir.Cast(inner, ir.F32, loc=loc)
        if isinstance(expr, sympy.Symbol):
            return self.leaves[expr]
        if expr.is_Number:
            if want == ir.I32:
                return ir.Const(wrap_i32(int(expr)), ir.I32, loc=loc)
            value = round_f32(float(expr))
            if expr != 0 and not (is_finite(value) and abs(value) >= F32_MIN_NORMAL):
                raise ConstantOutOfRange(value)
            return ir.Const(value, ir.F32, loc=loc)
        if isinstance(expr, sympy.Add):
            return self._add(expr, want, origin)
        if isinstance(expr, sympy.Mul):
            return self._mul(expr, want, origin)
        if isinstance(expr, sympy.Pow):
            return self._mul(sympy.Mul(expr, evaluate=False), want, origin)
        raise ValueError(f"unexpected SymPy node {expr!r}")

    def _add(self, expr: sympy.Add, want: str, origin: ir.Expr) -> ir.Expr:
        terms = list(expr.as_ordered_terms())
        if want == ir.F32:
            ints = [t for t in terms if t.is_integer]
            rest = [t for t in terms if not t.is_integer]
            if len(ints) > 1:
                terms = rest + [sympy.Add(*ints)]
        positive = [t for t in terms if not _is_negative(t)]
        negative = [-t for t in terms if _is_negative(t)]
        loc = origin.loc
        if not positive:
            result: ir.Expr = ir.Unary(
                "neg", self.from_sympy(negative.pop(0), want, origin), want, loc=loc
            )
        else:
            result = self.from_sympy(positive[0], want, origin)
            for t in positive[1:]:
                result = ir.Binary("+", result, self.from_sympy(t, want, origin), want, loc=loc)
        for t in negative:
            result = ir.Binary("-", result, self.from_sympy(t, want, origin), want, loc=loc)
        return result

    def _mul(self, expr: sympy.Expr, want: str, origin: ir.Expr) -> ir.Expr:
        loc = origin.loc
        coeff, factors = expr.as_coeff_mul()
        for f in factors:
            if f.is_Number:
                coeff = coeff * f
        factors = tuple(f for f in factors if not f.is_Number)
        if coeff < 0:
            return ir.Unary("neg", self.from_sympy(-expr, want, origin), want, loc=loc)
        num: list[sympy.Expr] = [] if float(coeff) == 1.0 else [coeff]
        den: list[sympy.Expr] = []
        for f in factors:
            base, exp = f.as_base_exp()
            if exp.is_Integer and abs(int(exp)) > MAX_POWER:
                raise FormTooLarge(f"power {exp}")
            if exp.is_Integer and int(exp) < 0:
                den.extend([base] * -int(exp))
            elif exp.is_Integer and int(exp) > 1:
                num.extend([base] * int(exp))
            else:
                num.append(f)
        if want == ir.F32:
            ints = [f for f in num if f.is_integer and not f.is_Number]
            if len(ints) > 1:
                num = [f for f in num if f not in ints or f.is_Number] + [sympy.Mul(*ints)]
        if want == ir.F32 and len(num) + len(den) > 2:
            folded = self._fold_low_factors(num, den, origin)
            if folded is not None:
                return folded
        numerator = self._product(num, want, origin)
        if not den:
            return numerator
        denominator = self._product(den, want, origin)
        if level(denominator) == ir.REQUEST and level(numerator) > ir.REQUEST:
            one = ir.Const(1.0, ir.F32, loc=loc)
            reciprocal = ir.Binary("/", one, denominator, ir.F32, loc=loc)
            if isinstance(numerator, ir.Const) and numerator.value == 1.0:
                return reciprocal
            return ir.Binary("*", numerator, reciprocal, ir.F32, loc=loc)
        return ir.Binary("/", numerator, denominator, ir.F32, loc=loc)

    def _fold_low_factors(
        self, num: list[sympy.Expr], den: list[sympy.Expr], origin: ir.Expr
    ) -> ir.Expr | None:
        """``high * (low / den)`` for an f32 product of factors known at different levels
        (``s * sm_scale / cap`` -> ``s * (sm_scale / cap)``, ``2 * s * sm_scale`` ->
        ``s * (2 * sm_scale)``): the lower-level part is hoisted whole, and one multiply is
        left per element. None when that saves nothing (one low factor and no denominator,
        or a denominator at the top level)."""
        irs = [self.from_sympy(f, ir.F32, origin) for f in num]
        denominator = self._product(den, ir.F32, origin) if den else None
        levels = [level(x) for x in irs] + ([level(denominator)] if denominator else [])
        top = max(levels)
        low = [x for x in irs if level(x) < top]
        high = [x for x in irs if level(x) == top]
        if not high or (denominator is not None and level(denominator) == top):
            return None
        if (denominator is None and len(low) < 2) or (denominator is not None and not low):
            return None
        loc = origin.loc
        part = self._chain(low, loc)
        if denominator is not None:
            part = ir.Binary("/", part, denominator, ir.F32, loc=loc)
        return ir.Binary("*", self._chain(high, loc), part, ir.F32, loc=loc)

    @staticmethod
    def _chain(factors: list[ir.Expr], loc: object) -> ir.Expr:
        result = factors[0]
        for f in factors[1:]:
            result = ir.Binary("*", result, f, ir.F32, loc=loc)  # type: ignore[arg-type]
        return result

    def _product(self, factors: list[sympy.Expr], want: str, origin: ir.Expr) -> ir.Expr:
        if not factors:
            return ir.Const(1 if want == ir.I32 else 1.0, want, loc=origin.loc)
        result = self.from_sympy(factors[0], want, origin)
        for f in factors[1:]:
            result = ir.Binary("*", result, self.from_sympy(f, want, origin), want, loc=origin.loc)
        return result


def _is_finite_constant(c: ir.Const) -> bool:
    return c.type != ir.F32 or is_finite(float(c.value))


def _is_negative(term: sympy.Expr) -> bool:
    coeff, _ = term.as_coeff_mul()
    return bool(coeff < 0)
