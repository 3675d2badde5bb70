"""The second back end: an eager PyTorch reference of a variant, emitted as Python source."""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass

from attnc.codegen.guarded_reads import guarded_children
from attnc.codegen.names import comment_text
from attnc.codegen.templates import render_template
from attnc.codegen.torch_expr import decides, render_torch
from attnc.compiler import ir
from attnc.compiler.index_range import proven_loads
from attnc.dsl.limits import deep_recursion

# Python's parser allows 200 nested parentheses: a node this many levels above the leaves
# gets a local name, so no generated line nests deeper than about twice this.
NESTING_STEP = 48


@dataclass(frozen=True)
class PythonBody:
    """A generated function body: ``(local name, expression)`` lines, then the result;
    ``reads_binary32``: it reads ``e32``, the environment rounded to binary32 (a decision on
    f32 values, see :func:`~attnc.codegen.torch_expr.decides`)."""

    lines: tuple[tuple[str, str], ...]
    result: str
    reads_binary32: bool = False


def python_body(
    e: ir.Expr | None, default: str, proven: frozenset[ir.Expr] = frozenset()
) -> PythonBody:
    """The body computing ``e`` (``default`` when None); a sub-expression used twice or more
    is bound to a local once, so the text grows with the DAG, not its unfolded tree.
    ``proven``: the reads read plainly (see :func:`render_torch`)."""
    if e is None:
        return PythonBody((), default)
    nodes = ir.postorder(e)
    uses: dict[int, int] = {}
    for node in nodes:
        for c in ir.children(node):
            uses[id(c)] = uses.get(id(c), 0) + 1
    names: dict[ir.Expr, str] = {}
    names32: dict[ir.Expr, str] = {}
    lines: list[tuple[str, str]] = []
    unguarded = _unguarded(nodes)
    wide, narrow = _precisions(nodes)
    for node in nodes:
        deep = ir.depth(node) % NESTING_STEP == 0  # keeps each line's nesting bounded
        if not ((uses.get(id(node), 0) > 1 or deep) and ir.children(node)):
            continue
        guarded = id(node) not in unguarded
        for binary32, bound, kept in ((True, narrow, names32), (False, wide, names)):
            if id(node) in bound and node not in kept:
                text = render_torch(
                    node, names, guarded, proven, names32=names32, binary32=binary32
                )
                kept[node] = f"_t{len(lines)}"
                lines.append((kept[node], text))
    result = render_torch(e, names, proven=proven, names32=names32)
    return PythonBody(tuple(lines), result, reads_binary32=bool(narrow))


def _precisions(nodes: list[ir.Expr]) -> tuple[set[int], set[int]]:
    """ids of the nodes (``nodes``: a postorder, root last) rendered in the reference's type
    and of those rendered in binary32: a decision and everything below it is binary32."""
    wide: set[int] = {id(nodes[-1])}
    narrow: set[int] = set()
    for node in reversed(nodes):  # every parent before its children
        if id(node) in narrow or (id(node) in wide and decides(node)):
            narrow.update(id(c) for c in ir.children(node))
        if id(node) in wide and not decides(node):
            wide.update(id(c) for c in ir.children(node))
    return wide, narrow


def _unguarded(nodes: list[ir.Expr]) -> set[int]:
    """ids of the nodes (``nodes``: a postorder, root last) the kernels evaluate on some path
    from the root that passes no guard (see :func:`guarded_children`)."""
    found = {id(nodes[-1])}
    for node in reversed(nodes):  # every parent before its children
        if id(node) in found:
            found.update(id(c) for c, guarded in guarded_children(node) if not guarded)
    return found


def emit_reference_source(v: ir.VariantIR) -> str:
    """Python source of a module with ``score(env, P)``, ``mask(env, P)``, ``output(env, P)``
    and ``sink(env, P)``."""
    with deep_recursion():
        return _render_reference(v)


def _render_reference(v: ir.VariantIR) -> str:
    proven = proven_loads(v)
    return render_template(
        "reference.py.j2",
        name=comment_text(v.name),
        use_softmax=v.normalize == "softmax",
        has_mask=v.mask is not None,
        has_score=v.score is not None,
        has_output=v.output is not None,
        has_sink=v.sink is not None,
        sink=python_body(v.sink, "None", proven),
        score=python_body(v.score, "env['score']", proven),
        mask=python_body(v.mask, "None", proven),
        output=python_body(v.output, "env['out']", proven),
    )


_MODULE_SERIALS = itertools.count()


def load_reference(v: ir.VariantIR) -> types.ModuleType:
    """Compile the emitted reference source into a module object, named uniquely in this
    process (``attnc_reference_<variant>_<n>``) so that it can stand in ``sys.modules``."""
    source = emit_reference_source(v)
    module = types.ModuleType(f"attnc_reference_{v.name}_{next(_MODULE_SERIALS)}")
    module.__dict__["__source__"] = source
    exec(compile(source, f"<attnc reference of {comment_text(v.name)}>", "exec"), module.__dict__)
    return module
