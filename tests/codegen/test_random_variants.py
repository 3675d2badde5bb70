"""Random well-typed variants through the whole pipeline: lowering, simplification, the CUDA
functor and the PyTorch reference must agree (host harness), and every stage must accept the
program. Deterministic (derandomized) so CI sees the same programs every run."""

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnc.codegen.functor import emit_functor
from attnc.codegen.torch_ref import emit_reference_source
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

PARAMS = """    param a: f32 = 1.5;
    param w: i32 = 3;
    param flag: bool = true;
    param t: tensor<f32>[num_qo_heads];
    param doc: tensor<i32>[kv_len];
    param bonus: tensor<f32>[q_len];
    param win: tensor<i32>[batch_size];
"""

# Integer leaves stay small so products of a few of them fit in i32 (overflow is undefined).
INT_LEAVES = ["q_idx", "kv_idx", "q_pos", "qo_head", "kv_head", "q_len", "kv_len", "w", "3", "7"]
INT_LEAVES += ["doc[kv_idx]", "doc[q_pos]", "win[batch]"]  # language v2 tensors
FLOAT_LEAVES = ["score", "sm_scale", "a", "t[qo_head]", "0.5", "2.0", "float(kv_idx)"]
FLOAT_LEAVES += ["bonus[q_idx]"]
# Row-level values a sink may read (no kv_idx, no score).
SINK_TERMS = ["t[qo_head]", "a * 0.5", "bonus[q_idx] - 1.0", "float(doc[q_pos])"]
SINK_TERMS += ["float(win[batch]) * 0.25", "float(q_pos) * 0.125", "2.0"]


def ints(depth: int) -> st.SearchStrategy[str]:
    leaf = st.sampled_from(INT_LEAVES)
    if depth == 0:
        return leaf
    sub = ints(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["+", "-"]), sub).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
        st.tuples(sub, st.sampled_from(["2", "5"])).map(lambda x: f"({x[0]} * {x[1]})"),
        st.tuples(sub, st.sampled_from(["/", "%"]), sub).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
        st.tuples(sub, sub).map(lambda x: f"min({x[0]}, {x[1]})"),
        sub.map(lambda x: f"abs({x})"),
    )


def bools(depth: int) -> st.SearchStrategy[str]:
    cmp = st.tuples(ints(1), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), ints(1)).map(
        lambda x: f"{x[0]} {x[1]} {x[2]}"
    )
    if depth == 0:
        return st.one_of(cmp, st.just("flag"))
    sub = bools(depth - 1)
    return st.one_of(
        cmp,
        st.tuples(sub, st.sampled_from(["&&", "||"]), sub).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
        sub.map(lambda x: f"!({x})"),
    )


def floats(depth: int) -> st.SearchStrategy[str]:
    leaf = st.one_of(st.sampled_from(FLOAT_LEAVES), ints(1).map(lambda x: f"float({x})"))
    if depth == 0:
        return leaf
    sub = floats(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(
            lambda x: f"({x[0]} {x[1]} {x[2]})"
        ),
        st.tuples(sub, sub).map(lambda x: f"({x[0]} / (abs({x[1]}) + 1.0))"),
        st.tuples(sub, sub).map(lambda x: f"max({x[0]}, {x[1]})"),
        sub.map(lambda x: f"tanh({x})"),
        sub.map(lambda x: f"sigmoid({x})"),
        st.tuples(bools(0), sub, sub).map(lambda x: f"({x[0]} ? {x[1]} : {x[2]})"),
    )


@st.composite
def programs(draw) -> str:
    lines = ["variant random {", PARAMS]
    if draw(st.booleans()):
        lines.append(f"    let u = {draw(floats(1))};")
        score = f"u + {draw(floats(1))}"
    else:
        score = draw(floats(2))
    lines.append(f"    score = {score};")
    if draw(st.booleans()):
        lines.append(f"    mask = {draw(bools(1))};")
    if draw(st.booleans()):
        lines.append("    output = out * (1.0 + float(qo_head)) - a;")
    if draw(st.booleans()):
        lines.append("    normalize = none;")
    elif draw(st.booleans()):
        terms = draw(st.lists(st.sampled_from(SINK_TERMS), min_size=1, max_size=3))
        lines.append(f"    sink = {' + '.join(terms)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _compile(text: str):
    compiled, _ = compile_source(text, "<random>")
    assert len(compiled) == 1
    return compiled[0]


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs())
def test_every_stage_accepts_random_programs(text):
    c = _compile(text)
    assert "struct Variant_random {" in emit_functor(c)
    compile(emit_reference_source(c.variant), "<reference>", "exec")


@pytest.mark.nvcc
@pytest.mark.skipif(
    shutil.which("nvcc") is None and shutil.which("g++") is None, reason="no compiler"
)
@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs())
def test_random_variant_functor_matches_reference(text):
    report = run_host_test(_compile(text), points=300, seed=3, cases=3)
    assert report.ok, f"{report.summary()}\n{text}"
