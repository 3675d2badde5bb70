"""Request members and Row fields built from shared sub-expressions: the functor binds each
shared part once (as the element bodies do), so a chain of lets is emitted in its size, and
the functor still agrees with the reference (host harness)."""

from __future__ import annotations

import shutil

import pytest

from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def _chain(name: str, start: str, length: int) -> str:
    """Lets ``name0 = start; name{i+1} = name{i} * (1 - name{i})``: each used twice by the next."""
    lets = [f"    let {name}0 = {start};"]
    lets += [f"    let {name}{i + 1} = {name}{i} * (1.0 - {name}{i});" for i in range(length)]
    return "\n".join(lets)


def _source(length: int) -> str:
    return f"""variant chains {{
{_chain("a", "float(q_idx % 7) * 0.1", length)}
{_chain("b", "float(kv_len % 5) * 0.15", length)}
    let d = 100 / q_idx;
    score = score + a{length} + b{length} + (q_idx > 0 ? float(d + d) * 0.001 : 0.0);
    mask = kv_idx <= q_pos;
}}"""


def test_a_chain_of_shared_row_and_request_values_is_emitted_in_its_size():
    """A Row field (a) and a request member (b), each a chain of 40 lets, were printed as
    their unfolded trees: 790 KB of functor at 14 lets, and no end at 40."""
    compiled = compile_source(_source(40), "chains.attn")[0][0]
    assert compiled.affine is not None  # the chains are the score's per-row bias
    text = emit_functor(compiled)
    assert len(text) < 30_000
    # The guarded division stays under its guard here: the whole ?: is one Row field, so
    # nothing inside it is hoisted apart (an i32 / or % alone could be: idiv_ is total).
    assert "idiv_(100, q_idx)" in text and "= attnc::vm::idiv_(100" not in text


def test_the_functor_of_shared_chains_matches_the_reference():
    """The bound parts compute what the reference computes, the guarded i32 division included
    (at q_idx = 0 its guard picks 0.0). A short chain: the harness's evaluation of the IR
    walks the unfolded tree."""
    report = run_host_test(compile_source(_source(6), "chains.attn")[0][0], points=500, cases=3)
    assert report.ok, report.summary()
