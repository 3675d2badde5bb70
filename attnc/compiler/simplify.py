"""SymPy simplification of numeric sub-expressions.

Arithmetic (+ - * and f32 /) goes through SymPy, which folds constants and puts sums and
products in a canonical order; everything else (calls, selects, tensor loads, i32 / and %,
casts to i32) becomes an opaque atom whose children are simplified recursively. Division by
a request-level value becomes a multiplication by its reciprocal, which hoisting then moves
out of the inner loop. Integer sub-sums inside f32 arithmetic stay integer and are converted
once, as in the source.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from attnc.compiler import ir
from attnc.compiler.evaluate import EvalError, evaluate
from attnc.compiler.hoist import level


def simplify_variant(v: ir.VariantIR) -> ir.VariantIR:
    """``v`` with score, mask and output simplified."""
    return replace(
        v,
        score=_maybe(v.score),
        mask=_maybe(v.mask),
        output=_maybe(v.output),
    )


def _maybe(e: ir.Expr | None) -> ir.Expr | None:
    return None if e is None else simplify_expr(e)


def simplify_expr(e: ir.Expr) -> ir.Expr:
    """An expression equal to ``e`` (up to float rounding) in canonical, folded form."""
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
        value = evaluate(e, {})
    except (EvalError, KeyError, ZeroDivisionError, OverflowError, ValueError):
        return None
    if isinstance(value, float) and not _finite(value):
        return None
    return ir.Const(value, e.type, e.loc)


def _has_free_leaf(e: ir.Expr) -> bool:
    return any(isinstance(n, (ir.Builtin, ir.ParamRef, ir.TensorLoad)) for n in ir.walk(e))


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


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
                    return ir.Const(absorbing, ir.BOOL, e.loc)
                return y
        if a == b:
            return a
        return replace(e, a=a, b=b)
    if isinstance(e, ir.Unary) and e.op == "not":
        x = simplify_expr(e.x)
        if isinstance(x, ir.Unary) and x.op == "not":
            return x.x
        if isinstance(x, ir.Const):
            return ir.Const(not x.value, ir.BOOL, e.loc)
        return replace(e, x=x)
    return _simplify_children(e)


class SympyConverter:
    """IR <-> SymPy for one arithmetic tree."""

    def __init__(self) -> None:
        self.leaves: dict[sympy.Symbol, ir.Expr] = {}
        self.symbols: dict[ir.Expr, sympy.Symbol] = {}

    def roundtrip(self, e: ir.Expr) -> ir.Expr | None:
        expr = self.to_sympy(e)
        if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return None
        return self.from_sympy(expr, e.type, e)

    # ------------------------------------------------------------------ IR -> SymPy
    def to_sympy(self, e: ir.Expr) -> sympy.Expr:
        if isinstance(e, ir.Const):
            if e.type == ir.I32:
                return sympy.Integer(int(e.value))
            return sympy.Float(float(e.value), 17)
        if isinstance(e, ir.Unary) and e.op == "neg":
            return -self.to_sympy(e.x)
        if isinstance(e, ir.Binary) and e.op in ("+", "-", "*"):
            a, b = self.to_sympy(e.a), self.to_sympy(e.b)
            return a + b if e.op == "+" else a - b if e.op == "-" else a * b
        if isinstance(e, ir.Binary) and e.op == "/" and e.type == ir.F32:
            return self.to_sympy(e.a) / self.to_sympy(e.b)
        if isinstance(e, ir.Cast) and e.type == ir.F32 and e.x.type == ir.I32:
            return self.to_sympy(e.x)
        return self._atom(e)

    def _atom(self, e: ir.Expr) -> sympy.Expr:
        inner = e if isinstance(e, (ir.Builtin, ir.ParamRef)) else _simplify_children(e)
        folded = _fold_constant(inner)
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
        loc = origin.loc
        if want == ir.F32 and expr.is_integer:
            inner = self.from_sympy(expr, ir.I32, origin)
            if isinstance(inner, ir.Const):
                return ir.Const(float(inner.value), ir.F32, loc)
            return ir.Cast(inner, ir.F32, loc)
        if isinstance(expr, sympy.Symbol):
            return self.leaves[expr]
        if expr.is_Number:
            if want == ir.I32:
                return ir.Const(int(expr), ir.I32, loc)
            return ir.Const(float(expr), ir.F32, loc)
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
                "neg", self.from_sympy(negative.pop(0), want, origin), want, loc
            )
        else:
            result = self.from_sympy(positive[0], want, origin)
            for t in positive[1:]:
                result = ir.Binary("+", result, self.from_sympy(t, want, origin), want, loc)
        for t in negative:
            result = ir.Binary("-", result, self.from_sympy(t, want, origin), want, loc)
        return result

    def _mul(self, expr: sympy.Expr, want: str, origin: ir.Expr) -> ir.Expr:
        loc = origin.loc
        coeff, factors = expr.as_coeff_mul()
        for f in factors:
            if f.is_Number:
                coeff = coeff * f
        factors = tuple(f for f in factors if not f.is_Number)
        if coeff < 0:
            return ir.Unary("neg", self.from_sympy(-expr, want, origin), want, loc)
        num: list[sympy.Expr] = [] if float(coeff) == 1.0 else [coeff]
        den: list[sympy.Expr] = []
        for f in factors:
            base, exp = f.as_base_exp()
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
        numerator = self._product(num, want, origin)
        if not den:
            return numerator
        denominator = self._product(den, want, origin)
        if level(denominator) == ir.REQUEST and level(numerator) > ir.REQUEST:
            one = ir.Const(1.0, ir.F32, loc)
            reciprocal = ir.Binary("/", one, denominator, ir.F32, loc)
            if isinstance(numerator, ir.Const) and numerator.value == 1.0:
                return reciprocal
            return ir.Binary("*", numerator, reciprocal, ir.F32, loc)
        return ir.Binary("/", numerator, denominator, ir.F32, loc)

    def _product(self, factors: list[sympy.Expr], want: str, origin: ir.Expr) -> ir.Expr:
        if not factors:
            return ir.Const(1 if want == ir.I32 else 1.0, want, origin.loc)
        result = self.from_sympy(factors[0], want, origin)
        for f in factors[1:]:
            result = ir.Binary("*", result, self.from_sympy(f, want, origin), want, origin.loc)
        return result


def _is_negative(term: sympy.Expr) -> bool:
    coeff, _ = term.as_coeff_mul()
    return bool(coeff < 0)
