"""Mutated language-v2 specs (sinks, per-token and per-request tensors): whatever the
mutation, compiling either succeeds or fails with an AttnError located inside the text --
never another exception, never an error without a place."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import AttnError

SPECS = [
    """variant doc_causal {
    doc "packed documents";
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}
""",
    """variant per_request_window {
    param window: tensor<i32>[batch_size];
    mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];
}
""",
    """variant gpt_oss_local {
    param sinks: tensor<f32>[num_qo_heads];
    param window: i32 = 128;
    sink = sinks[qo_head];
    mask = kv_idx <= q_pos && q_pos - kv_idx < window;
}
""",
    """variant query_bonus {
    param bonus: tensor<f32>[q_len, num_qo_heads];
    let here = q_idx;
    score = score + bonus[here, qo_head];
    sink = bonus[q_idx, qo_head] * 2.0;
}
""",
]
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*|\S")
REPLACEMENTS = [
    "kv_idx", "q_pos", "q_idx", "batch", "kv_len", "q_len", "batch_size", "sink", "score",
    "doc", "window", "sinks", "normalize", "none", "softmax", "out", "1", "0.5", "[", "]",
    ";", "=", "+", "-", "sink = 1.0;", "normalize = none;", "num_qo_heads", "tensor<i32>",
]  # fmt: skip
FUZZ = settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(SPECS))
    tokens = [m for m in TOKEN.finditer(text)]
    for _ in range(draw(st.integers(1, 3))):
        m = draw(st.sampled_from(tokens))
        kind = draw(st.sampled_from(["replace", "delete", "insert", "duplicate"]))
        if kind == "replace":
            new = draw(st.sampled_from(REPLACEMENTS))
        elif kind == "delete":
            new = ""
        elif kind == "insert":
            new = m.group() + " " + draw(st.sampled_from(REPLACEMENTS))
        else:
            new = m.group() + " " + m.group()
        text = text[: m.start()] + new + text[m.end() :]
        tokens = [t for t in TOKEN.finditer(text)] or tokens
    return text


@FUZZ
@given(mutated())
def test_mutated_v2_specs_compile_or_fail_with_a_located_error(text: str) -> None:
    try:
        compile_source(text, "m.attn")
    except AttnError as err:
        lines = text.split("\n")
        assert err.loc.file == "m.attn"
        assert 1 <= err.loc.line <= len(lines), (err, text)
        assert 1 <= err.loc.col <= len(lines[err.loc.line - 1]) + 1, (err, text)
        assert str(err).startswith(f"m.attn:{err.loc.line}:{err.loc.col}: error: ")
