"""Equality of IR DAGs built separately costs their distinct nodes, not their unfolded trees."""

import time

from attnc.compiler import ir


def _doubling_chain(depth: int) -> ir.Expr:
    node: ir.Expr = ir.Const(1.0, ir.F32)
    for _ in range(depth):
        node = ir.Binary("+", node, node, ir.F32)
    return node


def test_two_copies_of_a_deep_dag_compare_in_linear_time():
    a, b = _doubling_chain(60), _doubling_chain(60)  # 2**60 paths each
    assert a is not b
    start = time.perf_counter()
    assert a == b
    assert hash(a) == hash(b)
    assert time.perf_counter() - start < 1.0


def test_unequal_deep_dags_stay_unequal():
    a = _doubling_chain(50)
    b = ir.Binary("+", _doubling_chain(49), ir.Const(2.0, ir.F32), ir.F32)
    assert a != b
    assert _doubling_chain(50) == a
