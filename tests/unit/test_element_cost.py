"""The functor's ``kScoreTranscendentals``: the MUFU-pipe calls (tanh, exp, sigmoid, ...) a
score evaluates per element, which decide whether the Hopper consumers move part of the
softmax's exp2s to the FMA pipe. Calls hoisted per row or request do not count, nor calls in
a key term (computed once per key); a shared call counts once."""

from __future__ import annotations

import re

import pytest

from attnc.codegen.functor import emit_functor
from attnc.compiler.pipeline import compile_source, resolve_source


def _count(functor: str) -> int:
    found = re.findall(r"static constexpr int kScoreTranscendentals = (\d+);", functor)
    assert len(found) == 1, functor
    return int(found[0])


def _stdlib(name: str) -> int:
    compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
    return _count(emit_functor(compiled[0]))


def _source(body: str) -> int:
    compiled, _ = compile_source("variant v {\n" + body + "\n}\n", "x.attn")
    return _count(emit_functor(compiled[0]))


@pytest.mark.parametrize(("name", "count"), [
    ("causal", 0), ("alibi", 0), ("sliding_window", 0), ("prefix_lm", 0),
    ("softcap", 1), ("sigmoid", 1),
])  # fmt: skip
def test_stdlib_counts(name: str, count: int) -> None:
    assert _stdlib(name) == count


@pytest.mark.parametrize(("body", "count"), [
    # per row or per request: hoisted out of the element
    ("param b: f32 = 1.0;\nscore = score + tanh(b);", 0),
    ("score = score + exp(float(q_pos) * 0.01);", 0),
    # per key: evaluated per element
    ("score = score + log(float(kv_idx) + 1.0);", 1),
    ("score = tanh(score) + exp(score * 0.5);", 2),
    ("score = tanh(score) * tanh(score);", 1),
    ("score = 2.0 * score;", 0),
    # per key through a tensor read (a key term): computed once per key, staged for the tile
    ("param kb: tensor<f32>[kv_len];\nscore = score + exp(kb[kv_idx]);", 0),
    ("param kb: tensor<f32>[kv_len];\nscore = tanh(score) + exp(kb[kv_idx]);", 1),
])  # fmt: skip
def test_counts_only_per_element_calls(body: str, count: int) -> None:
    assert _source(body) == count
