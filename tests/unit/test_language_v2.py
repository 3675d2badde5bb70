"""Language v2 front end: batch-flattened tensor dims (kv_len, q_len, batch_size) with their
first-index rule, `sink = expr;`, the located errors of both, and the IR they lower to."""

from __future__ import annotations

import pytest

from attnc.compiler import ir
from attnc.compiler.pipeline import compile_source
from attnc.compiler.verify import IRVerifyError, verify_variant
from attnc.dsl.errors import AttnError

ISSUE_SPEC = """\
variant doc_causal {
    doc "packed documents: causal inside each document";
    param doc: tensor<i32>[kv_len];            # one value per KV token of the request
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}
variant per_request_window {
    param window: tensor<i32>[batch_size];     # one value per request
    mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];
}
variant gpt_oss_local {
    param sinks: tensor<f32>[num_qo_heads];
    param window: i32 = 128;
    sink = sinks[qo_head];                      # an extra logit in every row's softmax
    mask = kv_idx <= q_pos && q_pos - kv_idx < window;
}
"""


def compiled(text: str):
    found, warnings = compile_source(text, "x.attn")
    assert not warnings
    return {c.variant.name: c for c in found}


def error_of(text: str) -> AttnError:
    with pytest.raises(AttnError) as info:
        compile_source(text, "x.attn")
    return info.value


def test_issue_spec_lowers_with_token_dims_and_a_sink() -> None:
    found = compiled(ISSUE_SPEC)
    doc = found["doc_causal"].variant
    assert doc.param("doc").dims == ("kv_len",) and doc.param("doc").token_dim == "kv_len"
    assert doc.sink is None
    window = found["per_request_window"].variant.param("window")
    assert window.token_dim == "batch_size"
    local = found["gpt_oss_local"].variant
    assert isinstance(local.sink, ir.TensorLoad) and local.sink.name == "sinks"
    assert local.sink.type == ir.F32
    assert local.param("sinks").token_dim is None


def test_q_len_tensor_indexed_by_q_idx_and_kv_len_tensor_by_q_pos() -> None:
    found = compiled(
        "variant v {\n    param bonus: tensor<f32>[q_len];\n    param d: tensor<i32>[kv_len];\n"
        "    score = score + bonus[q_idx];\n    sink = float(d[q_pos]);\n}\n"
    )
    v = found["v"].variant
    assert v.param("bonus").token_dim == "q_len"
    assert isinstance(v.sink, ir.Cast)


def test_token_dim_with_more_dims_after_it() -> None:
    v = compiled(
        "variant v {\n    param b: tensor<f32>[kv_len, num_qo_heads];\n"
        "    score = score + b[kv_idx, qo_head];\n}\n"
    )["v"].variant
    assert v.param("b").dims == ("kv_len", "num_qo_heads")


# (id, source, exact message, "line:col")
ERRORS = [
    (
        "kv_len tensor shifted",
        "variant v {\n    param d: tensor<i32>[kv_len];\n    mask = d[kv_idx + 1] == 0;\n}\n",
        "tensor 'd' has one value per KV token (dim kv_len): its first index must be "
        "kv_idx or q_pos, exactly, so the read stays inside the request",
        "3:14",
    ),
    (
        "kv_len tensor by q_idx",
        "variant v {\n    param d: tensor<i32>[kv_len];\n    mask = d[q_idx] == 0;\n}\n",
        "tensor 'd' has one value per KV token (dim kv_len): its first index must be "
        "kv_idx or q_pos, exactly, so the read stays inside the request",
        "3:14",
    ),
    (
        "q_len tensor by kv_idx",
        "variant v {\n    param b: tensor<f32>[q_len];\n    score = score + b[kv_idx];\n}\n",
        "tensor 'b' has one value per query token (dim q_len): its first index must be "
        "q_idx, exactly, so the read stays inside the request",
        "3:23",
    ),
    (
        "batch_size tensor by a literal",
        "variant v {\n    param w: tensor<i32>[batch_size];\n    mask = kv_idx < w[0];\n}\n",
        "tensor 'w' has one value per request (dim batch_size): its first index must be "
        "batch, exactly, so the read stays inside the request",
        "3:23",
    ),
    (
        "token dim not first",
        "variant v {\n    param b: tensor<f32>[num_qo_heads, kv_len];\n"
        "    score = score + b[qo_head, kv_idx];\n}\n",
        "'kv_len' can only be the first dimension of a tensor (the tensor is flattened over "
        "the requests of a batch along it)",
        "2:40",
    ),
    (
        "unknown dim name",
        "variant v {\n    param b: tensor<f32>[kvlen];\n    score = score + b[kv_idx];\n}\n",
        "tensor dimension must be an integer or one of num_qo_heads, num_kv_heads, head_dim, "
        "kv_len, q_len, batch_size, got 'kvlen' (did you mean 'kv_len'?)",
        "2:26",
    ),
    (
        "sink reads kv_idx",
        "variant v {\n    sink = float(kv_idx) * 0.5;\n}\n",
        "sink (one value per query row) cannot use 'kv_idx'",
        "2:18",
    ),
    (
        "sink reads score",
        "variant v {\n    score = score * 2.0;\n    sink = score;\n}\n",
        "sink (one value per query row) cannot use 'score'",
        "3:12",
    ),
    (
        "second sink",
        "variant v {\n    sink = 1.0;\n    sink = 2.0;\n}\n",
        "sink is given twice (first at x.attn:2:5)",
        "3:5",
    ),
    (
        "sink with normalize none",
        "variant v {\n    sink = 1.0;\n    normalize = none;\n}\n",
        "a sink is an extra logit of the softmax: it needs normalize = softmax "
        "(normalize = none is given at x.attn:3:5)",
        "2:5",
    ),
    (
        "normalize none before the sink",
        "variant v {\n    normalize = none;\n    sink = 1.0;\n}\n",
        "a sink is an extra logit of the softmax: it needs normalize = softmax "
        "(normalize = none is given at x.attn:2:5)",
        "3:5",
    ),
    (
        "bool sink",
        "variant v {\n    sink = q_idx > 3;\n}\n",
        "sink must be a number (f32), got bool",
        "2:12",
    ),
    (
        "out in a sink",
        "variant v {\n    sink = out;\n}\n",
        "'out' can only be used in 'output = ...'",
        "2:12",
    ),
]


@pytest.mark.parametrize(
    "text, message, where", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_located_errors(text: str, message: str, where: str) -> None:
    err = error_of(text)
    assert err.message == message
    assert str(err.loc) == f"x.attn:{where}"
    rendered = err.render()
    assert rendered.startswith(f"x.attn:{where}: error: ") and "^" in rendered


def test_rendered_token_index_error_has_a_caret_under_the_index() -> None:
    err = error_of(
        "variant v {\n    param d: tensor<i32>[kv_len];\n    mask = d[kv_idx + 1] == 0;\n}\n"
    )
    lines = err.render().splitlines()
    assert lines[1] == "        mask = d[kv_idx + 1] == 0;"
    assert lines[2] == "                 ^~~~~~~~~~"


def test_let_bound_position_is_accepted() -> None:
    v = compiled(
        "variant v {\n    param d: tensor<i32>[kv_len];\n    let here = q_pos;\n"
        "    mask = d[kv_idx] == d[here];\n}\n"
    )["v"].variant
    loads = [n for n in ir.walk(v.mask) if isinstance(n, ir.TensorLoad)]
    assert {n.indices[0].name for n in loads} == {"kv_idx", "q_pos"}


def test_doc_is_a_name_outside_doc_items() -> None:
    v = compiled(
        'variant doc {\n    doc "documents";\n    param doc: tensor<i32>[kv_len];\n'
        "    let same = doc[kv_idx] == doc[q_pos];\n    mask = same;\n}\n"
    )["doc"].variant
    assert v.doc == "documents" and v.param("doc").token_dim == "kv_len"


def test_verifier_rejects_a_token_read_outside_the_slice() -> None:
    v = compiled("variant v {\n    param d: tensor<i32>[kv_len];\n    mask = d[kv_idx] == 0;\n}\n")[
        "v"
    ].variant
    load = next(n for n in ir.walk(v.mask) if isinstance(n, ir.TensorLoad))
    shifted = ir.TensorLoad("d", (ir.Builtin("q_idx", ir.I32),), ir.I32)
    bad = ir.Binary("==", shifted, load.indices[0], ir.BOOL)
    from dataclasses import replace

    with pytest.raises(IRVerifyError, match="outside its request's slice"):
        verify_variant(replace(v, mask=bad))


def test_verifier_rejects_a_sink_reading_kv_idx() -> None:
    v = compiled("variant v {\n    sink = 0.5;\n}\n")["v"].variant
    from dataclasses import replace

    bad = ir.Cast(ir.Builtin("kv_idx", ir.I32), ir.F32)
    with pytest.raises(IRVerifyError, match="element-level"):
        verify_variant(replace(v, sink=bad))


def test_sink_is_simplified_and_printed() -> None:
    c = compiled(
        "variant v {\n    param sinks: tensor<f32>[num_qo_heads];\n"
        "    sink = sinks[qo_head] * 1.0 + 0.0;\n}\n"
    )["v"]
    assert isinstance(c.variant.sink, ir.TensorLoad)
    from attnc.compiler.ir_printer import format_variant

    assert "  sink = sinks[qo_head]  : f32 @ head" in format_variant(c.variant)


def test_variant_cache_round_trips_v2_ir() -> None:
    from attnc.runtime.build import ir_json

    found = compiled(ISSUE_SPEC)
    for c in found.values():
        back = ir_json.decode(ir_json.encode(c))
        assert back.variant == c.variant and back.variant.sink == c.variant.sink
        assert back.mask_analysis == c.mask_analysis


def test_v2_examples_in_the_language_doc_compile() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text("utf-8")
    blocks = [b for b in re.findall(r"```\n(.*?)```", text, re.S) if "variant " in b]
    v2 = [b for b in blocks if "sink =" in b or "[kv_len]" in b or "[batch_size]" in b]
    assert len(v2) >= 2
    masks = Path(__file__).resolve().parents[2] / "attnc" / "stdlib_variants" / "masks.attn"
    for block in v2:
        if "..." in block:
            continue
        block = block.replace('import "masks.attn";', "")
        if "causal()" in block:  # the worked examples use the stdlib's mask helpers
            block = masks.read_text("utf-8") + block
        found, _ = compile_source(block, "language.md")
        assert found
    assert ISSUE_SPEC.split("variant per_request_window")[0].strip() in text
