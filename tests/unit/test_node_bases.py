"""The node bases: every AST and IR node is a frozen dataclass whose keyword-only ``loc`` takes
no part in equality or hashing; ``postorder_of`` visits a shared node once, children first;
the expression text walk rejects what is not an IR node."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from attnc.codegen.cuda_expr import CudaContext, render
from attnc.codegen.torch_expr import render_torch
from attnc.compiler import ir
from attnc.dsl import ast
from attnc.dsl.errors import NO_LOC, Loc
from attnc.dsl.parser import parse_expr

HERE, THERE = Loc("a.attn", 1, 2), Loc("b.attn", 3, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda loc: ast.Binary("+", ast.Name("x", loc=loc), ast.Num(1, False, loc=loc), loc=loc),
        lambda loc: ir.Binary(
            "+", ir.Builtin("kv_idx", ir.I32, loc=loc), ir.Const(1, ir.I32), ir.I32, loc=loc
        ),
        lambda loc: ir.ParamDecl("cap", "scalar", ir.F32, (), 30.0, loc=loc),
    ],
)
def test_loc_is_keyword_only_and_ignored_by_equality(make) -> None:
    a, b = make(HERE), make(THERE)
    assert a.loc == HERE and b.loc == THERE
    assert a == b and hash(a) == hash(b)
    assert "loc" not in repr(a)
    assert [f.name for f in dataclasses.fields(a) if f.kw_only] == ["loc"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.loc = THERE  # type: ignore[misc]


def test_loc_defaults_and_is_not_positional() -> None:
    assert ir.Const(1.0, ir.F32).loc == NO_LOC
    with pytest.raises(TypeError):
        ir.Const(1.0, ir.F32, HERE)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ast.Name("x", HERE)  # type: ignore[call-arg]


def test_different_fields_or_kinds_differ() -> None:
    one = ir.Const(1, ir.I32)
    assert one != ir.Const(2, ir.I32)
    assert one != ir.Const(1, ir.F32)
    assert ir.Unary("neg", one, ir.I32) != ir.Cast(one, ir.I32)


def test_expression_nodes_keep_the_shared_hash_and_pickle_without_caches() -> None:
    leaf = ir.Builtin("kv_idx", ir.I32, loc=HERE)
    tree = ir.Binary("+", leaf, leaf, ir.I32)
    copy = ir.Binary("+", ir.Builtin("kv_idx", ir.I32), ir.Builtin("kv_idx", ir.I32), ir.I32)
    assert tree == copy
    assert "_hash" in tree.__dict__
    restored = pickle.loads(pickle.dumps(tree))
    assert "_hash" not in restored.__dict__
    assert restored == tree and restored.a.loc == HERE


def test_parsed_nodes_carry_their_locations() -> None:
    expr = parse_expr("a + b", "t.attn")
    assert isinstance(expr, ast.Binary)
    assert (expr.right.loc.line, expr.right.loc.col) == (1, 5)


def test_postorder_of_visits_a_shared_node_once_children_first() -> None:
    kv = ir.Builtin("kv_idx", ir.I32)
    one = ir.Const(1, ir.I32)
    left = ir.Binary("+", kv, one, ir.I32)
    root = ir.Binary("*", left, left, ir.I32)
    assert ir.postorder(root) == [kv, one, left, root]
    assert [id(n) for n in ir.postorder(root)] == [id(kv), id(one), id(left), id(root)]
    graph = {"r": ["a", "b"], "a": ["c"], "b": ["c"], "c": []}
    assert ir.postorder_of(["r"], graph.__getitem__) == ["c", "a", "b", "r"]


def test_text_walks_reject_a_foreign_node() -> None:
    foreign = ast.Name("x")
    with pytest.raises(TypeError):
        render(foreign, CudaContext(builtins={}))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        render_torch(foreign)  # type: ignore[arg-type]


def test_hoisted_and_named_sub_expressions_are_spelled_by_name() -> None:
    kv = ir.Builtin("kv_idx", ir.I32)
    neg = ir.Unary("neg", kv, ir.I32)
    expr = ir.Binary("+", neg, neg, ir.I32)
    ctx = CudaContext(builtins={"kv_idx": "kv"})
    assert (
        render(expr, ctx)
        == "int(unsigned(int(0u - unsigned(kv))) + unsigned(int(0u - unsigned(kv))))"
    )
    ctx.hoisted[neg] = "h0"
    assert render(expr, ctx) == "int(unsigned(h0) + unsigned(h0))"
    assert render_torch(expr, {neg: "t0"}) == "_wrap(t0 + t0)"
    assert render_torch(ir.Unary("not", ir.Const(True, ir.BOOL), ir.BOOL)) == "(~_bool(env, True))"
