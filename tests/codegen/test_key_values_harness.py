"""The functor's key values (``V::KeyValues``, ``key_values`` and the ``*_at`` hooks, what the
Hopper kernel computes from the values it stages per key) in the host harness: its "K" lines
are compared with the float64 reference like the plain hooks' points."""

from __future__ import annotations

import pytest
from host_fixture import HARNESS_MARKS

import attnc.testing.host_test as host_test
from attnc.compiler.pipeline import compile_source
from attnc.testing.host_test import run_host_test

pytestmark = HARNESS_MARKS

BODIES = {
    "doc": "param doc: tensor<i32>[kv_len]; mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];",
    "bias": "param t: tensor<f32>[64]; score = score + t[kv_idx % 64];",
    "unproven": "param t: tensor<f32>[64]; param idx: tensor<i32>[kv_len];"
    " score = score + t[kv_idx] * 0.5 + t[idx[kv_idx]] * 0.25;",
    "scaled": "param t: tensor<f32>[64]; score = score * t[kv_idx % 64];",
    "sigmoid": "param t: tensor<f32>[kv_len]; normalize = none;"
    " score = sigmoid(score + t[kv_idx]);",
    "guarded": "param t: tensor<f32>[64]; score = kv_idx < 64 ? score + t[kv_idx] : score;",
}


def _compiled(name: str):
    (compiled,), _ = compile_source(f"variant {name} {{ {BODIES[name]} }}", f"{name}.attn")
    return compiled


@pytest.mark.parametrize("name", list(BODIES))
def test_key_values_agree_with_the_reference(name: str) -> None:
    report = run_host_test(_compiled(name), points=600, seed=5)
    assert report.ok, report.summary()
    assert report.key_value_points == report.points > 0


def test_wrong_key_values_fail_the_harness(monkeypatch) -> None:
    """A functor whose key values differ from its reads (the bias read one key further) fails,
    though its plain hooks are right."""
    emit = host_test.emit_functor

    def shifted(compiled):
        text = emit(compiled)
        read = "key.k0 = p.p_t[(kv_idx % 64)];"
        assert text.count(read) == 1
        return text.replace(read, "key.k0 = p.p_t[((kv_idx + 1) % 64)];")

    monkeypatch.setattr(host_test, "emit_functor", shifted)
    report = run_host_test(_compiled("bias"), points=600, seed=5)
    assert not report.ok
    assert report.affine_error > host_test.TOLERANCE


def test_a_deep_chain_of_key_lets_runs_in_the_harness() -> None:
    """250 chained lets of key terms under a score that is not additive: the harness lists
    the key terms within the compiler's recursion room (it raised RecursionError)."""
    lets = ["let a0 = t[kv_idx];"] + [
        f"let a{i} = a{i - 1} * 0.5 + t[kv_idx];" for i in range(1, 250)
    ]
    source = (
        "variant deep { param t: tensor<f32>[kv_len]; "
        + " ".join(lets)
        + " score = score * a249; }"
    )
    (compiled,), _ = compile_source(source, "deep.attn")
    report = run_host_test(compiled, points=200, seed=1)
    assert report.ok, report.summary()
    assert report.key_value_points == report.points > 0
