"""Owns: where a shared sub-expression that reads a tensor is bound to a local constant.

Such a node cannot be computed ahead of a guard it sits under (a ?: arm, the right side of
&& / ||): the guard may be what keeps its index in bounds. It is bound in the outermost scope
that always evaluates it: the function body, or the scope of a guarded operand, which is then
spelled as an immediately invoked lambda ``[&]() -> T { const T t5 = ...; return ...; }()``
holding the operand's own shared reads. A node is always evaluated with an expression when it
is reached from it without crossing a guard, or through both arms of a ?:. Evaluating it
first then reads only what the unguarded expression reads anyway (IR expressions have no
side effects), and each such node is printed once per scope, not once per path.
"""

from __future__ import annotations

from itertools import count

from attnc.codegen.cuda_expr import CTYPES, CudaContext, CudaText
from attnc.compiler import ir

_NONE: frozenset[int] = frozenset()


class GuardedScopes:
    """The tensor-reading shared nodes of an expression each of its nodes always evaluates.

    ``nodes`` is the expression's postorder, ``binds`` the ids of the nodes that get a local
    name and read a tensor; nodes in ``hoisted`` are computed elsewhere (not evaluated here).
    """

    def __init__(self, nodes: list[ir.Expr], binds: set[int], hoisted: dict[ir.Expr, str]) -> None:
        self.order = {id(n): i for i, n in enumerate(nodes)}
        self.by_id = {id(n): n for n in nodes}
        self.always: dict[int, frozenset[int]] = {}
        for node in nodes:
            self.always[id(node)] = _NONE if node in hoisted else self._always(node, binds)

    def _always(self, node: ir.Expr, binds: set[int]) -> frozenset[int]:
        seen = self.always
        if isinstance(node, ir.Select):
            found = seen[id(node.cond)] | (seen[id(node.a)] & seen[id(node.b)])
        elif isinstance(node, ir.Binary) and node.op in ir.LOGICAL:
            found = seen[id(node.a)]
        else:
            found = _NONE.union(*(seen[id(c)] for c in ir.children(node)))
        return found | {id(node)} if id(node) in binds else found

    def evaluated_with(self, e: ir.Expr) -> list[ir.Expr]:
        """The nodes to bind that ``e`` always evaluates (itself included), children first."""
        return [self.by_id[i] for i in sorted(self.always[id(e)], key=self.order.__getitem__)]


class ScopedCudaText(CudaText):
    """C++ text of one function body: a guarded operand that always evaluates a node to bind
    that no enclosing scope binds becomes a lambda binding it (see the module docstring).
    Names are ``<prefix>0, <prefix>1, ...`` in the order :meth:`fresh_name` gives them."""

    def __init__(self, ctx: CudaContext, scopes: GuardedScopes, prefix: str) -> None:
        super().__init__(ctx)
        self.scopes = scopes
        self.prefix = prefix
        self.numbers = count()

    def fresh_name(self) -> str:
        """The next local name of the body."""
        return f"{self.prefix}{next(self.numbers)}"

    def guarded(self, e: ir.Expr) -> str:
        """``e`` alone, or a lambda binding the shared reads it always evaluates first."""
        names = self.ctx.hoisted
        fresh = [n for n in self.scopes.evaluated_with(e) if n is not e and n not in names]
        if not fresh:
            return self.render(e)
        lines = []
        try:
            for node in fresh:
                value = self.render(node)
                names[node] = name = self.fresh_name()
                lines.append(f"const {CTYPES[node.type]} {name} = {value};")
            result = self.render(e)
        finally:
            for node in fresh:
                names.pop(node, None)
        return f"[&]() -> {CTYPES[e.type]} {{ {' '.join(lines)} return {result}; }}()"
