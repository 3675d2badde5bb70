"""What a guard is (attnc/codegen/guarded_reads.py ``guarded_children``: a ?: branch and the
right side of && / ||), and that the functor's walks and the PyTorch reference agree with it."""

from __future__ import annotations

from attnc.codegen.guarded_reads import always_evaluated, guard_walk, guarded_children
from attnc.codegen.torch_expr import render_torch
from attnc.compiler import ir

INT, BOOL = ir.I32, ir.BOOL
KV = ir.Builtin("kv_idx", INT)
Q = ir.Builtin("q_pos", INT)


def _read(name: str, index: ir.Expr, type_: str = INT) -> ir.TensorLoad:
    return ir.TensorLoad(name, (index,), type_)


def _lt(a: ir.Expr, b: ir.Expr) -> ir.Binary:
    return ir.Binary("<", a, b, BOOL)


def test_select_branches_and_logical_right_sides_are_guarded():
    cond, a, b = _lt(KV, Q), _read("x", KV), _read("y", KV)
    assert guarded_children(ir.Select(cond, a, b, INT)) == ((cond, False), (a, True), (b, True))
    for op in ir.LOGICAL:
        left, right = _lt(KV, Q), _lt(Q, KV)
        assert guarded_children(ir.Binary(op, left, right, BOOL)) == ((left, False), (right, True))


def test_other_nodes_guard_nothing():
    plus = ir.Binary("+", KV, Q, INT)
    assert guarded_children(plus) == ((KV, False), (Q, False))
    read = _read("x", plus)
    assert guarded_children(read) == ((plus, False),)
    assert guarded_children(KV) == ()


def test_guard_walk_marks_everything_below_a_guard():
    inner = _read("x", ir.Binary("+", KV, Q, INT))
    e = ir.Binary("&&", _lt(KV, Q), _lt(inner, Q), BOOL)
    flags = {
        (type(node).__name__, getattr(node, "name", None), guarded)
        for node, guarded in guard_walk(e)
    }
    assert ("TensorLoad", "x", True) in flags
    assert ("TensorLoad", "x", False) not in flags
    assert ("Builtin", "kv_idx", False) in flags  # the left side is not guarded
    assert ("Builtin", "kv_idx", True) in flags  # inside the guarded read's index


def test_always_evaluated_takes_a_node_in_both_branches_and_not_a_right_side():
    shared, alone = _read("x", KV), _read("y", KV)
    select = ir.Select(_lt(KV, Q), ir.Binary("+", shared, alone, INT), shared, INT)
    root = ir.Binary("&&", _lt(select, Q), _lt(_read("z", Q), Q), BOOL)
    nodes = _postorder(root)
    binds = {id(n) for n in nodes if isinstance(n, ir.TensorLoad)}
    always = always_evaluated(nodes, binds, {})
    assert id(shared) in always
    assert id(alone) not in always
    assert not any(
        isinstance(n, ir.TensorLoad) and n.name == "z" and id(n) in always for n in nodes
    )


def test_reference_guards_the_reads_the_kernels_guard():
    x, y = _read("x", KV), _read("y", ir.Binary("+", KV, Q, INT))
    proven = frozenset((x, y))
    text = render_torch(ir.Select(_lt(KV, Q), x, y, INT), proven=proven)
    assert text.count("_load_guarded(") == 2 and "_load(" not in text
    text = render_torch(ir.Binary("||", _lt(x, Q), _lt(y, KV), BOOL), proven=proven)
    assert text.count("_load_guarded(") == 1 and text.count("_load(") == 1
    assert text.index("_load(") < text.index("_load_guarded(")


def _postorder(e: ir.Expr) -> list[ir.Expr]:
    out: list[ir.Expr] = []
    seen: set[int] = set()

    def visit(node: ir.Expr) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for c in ir.children(node):
            visit(c)
        out.append(node)

    visit(e)
    return out
