"""The fp64 reference for the language-v2 variants against attention written out by hand:
sinks (o = sum_j e^{s_j} v_j / (e^{sink} + sum_j e^{s_j}), LSE with the sink, empty rows give
0 and LSE = sink), per-token document masks and per-request windows, and the slicing of
batch-flattened params for one request."""

from __future__ import annotations

import math

import pytest
import torch

import attnc
from attnc.runtime.reference import request_params, request_reference

V2_STDLIB = ("doc_causal", "per_request_window", "gpt_oss_local")


def inputs(q_len, kv_len, h, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(kv_len, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(kv_len, hk, d, generator=g, dtype=torch.float64)
    return q, k, v


def brute_force(q, k, v, keep, sink=None, sm_scale=None):
    """Row by row with Python floats: output [q_len, H, D] and LSE [q_len, H]."""
    q_len, h, d = q.shape
    kv_len, hk, _ = k.shape
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.zeros(q_len, h, d, dtype=torch.float64)
    lse = torch.zeros(q_len, h, dtype=torch.float64)
    for i in range(q_len):
        for head in range(h):
            kvh = head // (h // hk)
            logits = [
                float(q[i, head] @ k[j, kvh]) * scale for j in range(kv_len) if keep(i, j, head)
            ]
            rows = [j for j in range(kv_len) if keep(i, j, head)]
            s0 = -math.inf if sink is None else sink(i, head)
            m = max(logits + [s0])
            if m == -math.inf:
                lse[i, head] = -math.inf
                continue
            weights = [math.exp(x - m) for x in logits]
            denom = sum(weights) + math.exp(s0 - m)
            lse[i, head] = m + math.log(denom)
            if weights:
                acc = sum(w * v[j, kvh] for w, j in zip(weights, rows, strict=True))
                out[i, head] = acc / denom
    return out, lse


def close(a, b, tol=1e-10):
    assert a.shape == b.shape
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    finite = torch.isfinite(b)
    assert (a[finite] - b[finite]).abs().max().item() < tol if finite.any() else True


SHAPES = [(5, 9, 4, 2, 16), (7, 7, 4, 4, 8), (1, 11, 8, 2, 32), (9, 5, 2, 1, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("window", [128, 3, 0])
def test_gpt_oss_local_sinks_match_brute_force(shape, window) -> None:
    q, k, v = inputs(*shape)
    h = shape[2]
    sinks = torch.linspace(-1.5, 2.0, h, dtype=torch.float32)
    variant = attnc.load("stdlib:gpt_oss_local")
    out, lse = request_reference(variant, q, k, v, sinks=sinks, window=window, return_lse=True)
    q_len, kv_len = shape[0], shape[1]

    def keep(i, j, head):
        pos = i + kv_len - q_len
        return j <= pos and pos - j < window

    want_out, want_lse = brute_force(q, k, v, keep, sink=lambda i, head: float(sinks[head]))
    close(out, want_out)
    close(lse, want_lse)


def test_a_row_without_keys_gives_zero_and_lse_sink() -> None:
    q, k, v = inputs(4, 6, 2, 1, 8)
    sinks = torch.tensor([0.25, -3.0])
    variant = attnc.load("stdlib:gpt_oss_local")
    out, lse = request_reference(variant, q, k, v, sinks=sinks, window=0, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, sinks.double().expand(4, 2))


def test_a_sink_of_minus_infinity_is_no_sink() -> None:
    q, k, v = inputs(5, 9, 4, 2, 16)
    with_sink = attnc.load("stdlib:gpt_oss_local")
    minus_inf = torch.full((4,), -math.inf)
    out, lse = request_reference(with_sink, q, k, v, sinks=minus_inf, return_lse=True)
    plain = attnc.load("stdlib:sliding_window")
    want_out, want_lse = plain.reference(q, k, v, window=128, return_lse=True)
    close(out, want_out)
    close(lse, want_lse)


def test_sink_reads_row_values_and_params() -> None:
    text = (
        "variant v {\n    param base: f32 = 0.5;\n"
        "    sink = base + 0.125 * float(q_idx) - 0.25 * float(qo_head);\n}\n"
    )
    variant = attnc.load(text)
    q, k, v = inputs(6, 8, 4, 2, 16, seed=3)
    out, lse = request_reference(variant, q, k, v, base=-1.0, return_lse=True, sm_scale=0.3)
    want = brute_force(
        q, k, v, lambda i, j, h: True, sink=lambda i, h: -1.0 + 0.125 * i - 0.25 * h, sm_scale=0.3
    )
    close(out, want[0])
    close(lse, want[1])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_doc_causal_matches_brute_force(shape) -> None:
    q, k, v = inputs(*shape, seed=1)
    q_len, kv_len = shape[0], shape[1]
    doc = torch.tensor(sorted((j * 7 + 3) % 3 for j in range(kv_len)), dtype=torch.int32)
    out, lse = request_reference(attnc.load("stdlib:doc_causal"), q, k, v, doc=doc, return_lse=True)

    def keep(i, j, head):
        pos = i + kv_len - q_len
        # a row before the KV (pos < 0) sees no key: the causal part is false there
        return j <= pos and int(doc[j]) == int(doc[pos])

    want_out, want_lse = brute_force(q, k, v, keep)
    close(out, want_out)
    close(lse, want_lse)


def test_q_pos_read_before_the_kv_is_zero() -> None:
    variant = attnc.load(
        "variant v {\n    param d: tensor<i32>[kv_len];\n    mask = d[q_pos] == 0;\n}\n"
    )
    q, k, v = inputs(6, 3, 2, 1, 8)
    d = torch.tensor([5, 0, 5], dtype=torch.int32)
    out, lse = request_reference(variant, q, k, v, d=d, return_lse=True)
    # q_pos = q_idx - 3: rows 0..2 read 0 (every key visible), row 4 reads d[1] = 0
    visible_rows = [0, 1, 2, 4]
    want_out, want_lse = brute_force(q, k, v, lambda i, j, h: i in visible_rows)
    close(out, want_out)
    close(lse, want_lse)


@pytest.mark.parametrize("batch", [0, 2])
def test_per_request_window_reads_the_requests_window(batch) -> None:
    q, k, v = inputs(5, 12, 4, 2, 16, seed=2)
    windows = torch.tensor([2, 100, 4], dtype=torch.int32)
    variant = attnc.load("stdlib:per_request_window")
    out, lse = request_reference(variant, q, k, v, window=windows, batch=batch, return_lse=True)
    w = int(windows[batch])
    want_out, want_lse = brute_force(q, k, v, lambda i, j, h: j <= i + 7 and i + 7 - j < w)
    close(out, want_out)
    close(lse, want_lse)


def test_request_params_cut_batch_flattened_tensors() -> None:
    variant = attnc.load(
        "variant v {\n    param d: tensor<i32>[kv_len];\n    param b: tensor<f32>[q_len];\n"
        "    param w: tensor<i32>[batch_size];\n    param s: f32 = 1.0;\n"
        "    score = score * s + b[q_idx];\n"
        "    mask = d[kv_idx] == d[q_pos] && kv_idx < w[batch];\n}\n"
    )
    d, b, w = torch.arange(10), torch.arange(6.0), torch.tensor([3, 4])
    got = request_params(
        variant.params, {"d": d, "b": b, "w": w, "s": 2.0}, 1, [0, 2, 6], [0, 3, 10]
    )
    assert torch.equal(got["d"], d[3:10]) and torch.equal(got["b"], b[2:6])
    assert got["w"] is w and got["s"] == 2.0


def test_request_reference_names_a_wrongly_sized_param() -> None:
    q, k, v = inputs(5, 9, 4, 2, 16)
    variant = attnc.load("stdlib:doc_causal")
    with pytest.raises(
        ValueError,
        match="param 'doc' has one value per KV token: give this request's 9 entries, got 12",
    ):
        request_reference(variant, q, k, v, doc=torch.zeros(12, dtype=torch.int32))
    windows = attnc.load("stdlib:per_request_window")
    with pytest.raises(ValueError, match="param 'window' has one value per request"):
        request_reference(windows, q, k, v, window=torch.ones(2, dtype=torch.int32), batch=2)


def test_request_reference_names_a_tensor_param_it_cannot_take() -> None:
    """``None`` (or text) for a tensor param is a ValueError naming the param, not torch's
    RuntimeError from ``as_tensor``."""
    q, k, v = inputs(5, 9, 4, 2, 16)
    variant = attnc.load("stdlib:doc_causal")
    for value in (None, "doc"):
        with pytest.raises(ValueError, match="param 'doc' takes a tensor"):
            request_reference(variant, q, k, v, doc=value)


def test_request_reference_names_params_as_the_kernels_do() -> None:
    """An unknown, missing or wrongly typed param: the words of the kernels' param checks
    (``resolve_params``), did-you-mean included."""
    q, k, v = inputs(5, 9, 4, 2, 16)
    windows = attnc.load("stdlib:sliding_window")
    cases = [
        ({"windw": 3}, "unknown param 'windw'; did you mean 'window'?"),
        ({}, "missing param 'window' (i32)"),
        ({"window": 3.5}, "param 'window' (i32): expected an int, got float"),
        ({"window": None}, "param 'window' (i32): expected an int, got NoneType"),
    ]
    for given, words in cases:
        with pytest.raises(ValueError) as e:
            request_reference(windows, q, k, v, **given)
        assert str(e.value) == f"variant 'sliding_window': {words}"
        with pytest.raises(ValueError) as kernels:
            windows.reference(q, k, v, **given)
        assert str(kernels.value) == str(e.value)


def test_request_reference_takes_defaults_and_per_request_tensors() -> None:
    """A missing scalar takes its default; a tensor param may be anything ``torch.as_tensor``
    takes that holds the param's values exactly, a ``batch_size`` one read at ``batch``."""
    q, k, v = inputs(5, 9, 4, 2, 16)
    softcap = attnc.load("stdlib:softcap")
    assert torch.equal(request_reference(softcap, q, k, v), softcap.reference(q, k, v, cap=50.0))
    windows = attnc.load("stdlib:per_request_window")
    got = request_reference(windows, q, k, v, window=[9, 2, 4], batch=1)
    one = torch.tensor([2], dtype=torch.int32)
    assert torch.equal(got, request_reference(windows, q, k, v, window=one))


def test_request_reference_checks_tensors_as_the_reference_does() -> None:
    """A tensor param's value is checked as ``Variant.reference`` checks it (in its words,
    but for a shape's sizes, which are this request's): an int or a 0-d tensor failed with
    torch's IndexError, another shape with its RuntimeError, a sparse tensor with
    NotImplementedError, and a float32 tensor for an ``i32`` param ran."""
    q, k, v = inputs(4, 4, 2, 1, 8)
    variant = attnc.load("stdlib:doc_causal")
    head = "variant 'doc_causal': param 'doc' (tensor<i32>[kv_len]): "
    shape = "expected shape [4] (kv_len = this request's KV tokens), got "
    cases = [
        (3, shape + "[]"),
        ([0.0, 0.5, 1.0, 1.0], "expected dtype torch.int32, got torch.float32 (no implicit casts)"),
        (torch.tensor(3), shape + "[]"),
        (torch.zeros(4, 3, dtype=torch.int32), shape + "[4, 3]"),
        (torch.zeros(4), "expected dtype torch.int32, got torch.float32 (no implicit casts)"),
        (torch.zeros(4, dtype=torch.int64), "expected dtype torch.int32, got torch.int64"),
        (torch.zeros(4, dtype=torch.int32).to_sparse(), "expected a dense tensor"),
    ]
    for value, words in cases:
        with pytest.raises(ValueError) as caught:
            request_reference(variant, q, k, v, doc=value)
        assert str(caught.value).startswith(head + words)
        if isinstance(value, torch.Tensor):
            with pytest.raises(ValueError) as kernels:
                variant.reference(q, k, v, doc=value)
            batch_words = "(kv_len = sum of kv_len over the batch)"
            want = str(caught.value).replace("(kv_len = this request's KV tokens)", batch_words)
            assert str(kernels.value) == want
    local = attnc.load("stdlib:gpt_oss_local")
    with pytest.raises(
        ValueError, match=r"'sinks' \(tensor<f32>\[num_qo_heads\]\): expected shape"
    ):
        request_reference(local, q, k, v, sinks=torch.zeros(3), window=2)


def test_batched_reference_equals_one_request_at_a_time_in_one_flat_tensor() -> None:
    """Two documents packed in one request equal two separate causal requests."""
    q, k, v = inputs(10, 10, 2, 1, 8, seed=5)
    doc = torch.tensor([0] * 4 + [1] * 6, dtype=torch.int32)
    packed = request_reference(attnc.load("stdlib:doc_causal"), q, k, v, doc=doc)
    causal = attnc.load("stdlib:causal")
    first = causal.reference(q[:4], k[:4], v[:4])
    second = causal.reference(q[4:], k[4:], v[4:])
    close(packed, torch.cat([first, second]))


def test_output_transform_is_not_applied_to_rows_without_keys() -> None:
    variant = attnc.load(
        "variant v {\n    param s0: f32 = 0.5;\n    sink = s0;\n    mask = kv_idx <= q_pos;\n"
        "    output = out + 1.0;\n}\n"
    )
    q, k, v = inputs(6, 3, 2, 1, 8, seed=4)
    out, lse = request_reference(variant, q, k, v, return_lse=True)
    # q_pos = q_idx - 3: rows 0..2 see no key: output 0 (not 1), LSE = the sink
    assert torch.equal(out[:3], torch.zeros_like(out[:3]))
    assert torch.equal(lse[:3], torch.full((3, 2), 0.5, dtype=torch.float64))
    want, want_lse = brute_force(q, k, v, lambda i, j, h: j <= i - 3, sink=lambda i, h: 0.5)
    close(out[3:], want[3:] + 1.0)
    close(lse, want_lse)


def _keeps_every_key(source: str, keys: int, **params: float) -> None:
    """A float64 reference of ``source`` agrees with a float32 one and its LSE is every
    key's, unscaled: each decision holds for every key in binary32."""
    v = attnc.load(source=source)
    q, k, w = (torch.randn(n, 2, 16, dtype=torch.float64) for n in (1, keys, keys))
    out64, lse64 = v.reference(q, k, w, return_lse=True, **params)
    out32, lse32 = v.reference(q.float(), k.float(), w.float(), return_lse=True, **params)
    assert torch.allclose(out64, out32.double(), atol=1e-5)
    assert torch.allclose(lse64, lse32.double(), atol=1e-5)
    scores = torch.einsum("qhd,khd->hqk", q, k) / 4.0
    assert torch.allclose(lse64, torch.logsumexp(scores, -1).permute(1, 0))


def test_a_float64_reference_evaluates_the_mask_in_binary32() -> None:
    """float(kv_idx) + 2^31 <= 2^31 holds for every small kv_idx in binary32 (the kernels'
    arithmetic) and only for 0 in float64: a float64 reference kept one key of four."""
    _keeps_every_key("variant v { param p: f32 = 2147483648.0; mask = float(kv_idx) + p <= p; }", 4)


def test_a_float64_reference_decides_a_score_condition_in_binary32() -> None:
    """A ``?:`` in the score compares binary32 values, as the kernels do: in float64,
    float(kv_idx) + 2^31 <= 2^31 held for key 0 only and the other keys were scaled down."""
    _keeps_every_key(
        "variant v { param p: f32 = 2147483648.0;\n"
        "  score = float(kv_idx) + p <= p ? score : score - 30.0; }",
        4,
    )


def test_a_float64_reference_truncates_a_binary32_value() -> None:
    """int(float(kv_idx) + 2^24) - 2^24 is 0 for kv_idx 1 in binary32 (2^24 + 1 rounds to
    2^24), as the kernels compute it; a float64 reference gave 1 and scaled that key."""
    _keeps_every_key(
        "variant v { param p: f32 = 16777216.0;\n"
        "  score = int(float(kv_idx) + p) - 16777216 == 0 ? score : score - 30.0; }",
        2,
    )


@pytest.mark.parametrize(
    "score",
    [
        "floor(p + r) == p ? score : score - 30.0",  # floor(8388607.75) in float64
        "(float(kv_idx) + p) % 2.0 == 0.0 ? score : score - 30.0",  # 2^24 + 1 is 2^24
        "(float(kv_idx) + p) - s == 0.0 ? score : score - 30.0",  # two steps before the test
    ],
)
def test_a_float64_reference_takes_every_decision_in_binary32(score: str) -> None:
    """floor, % and comparisons of several f32 steps decide on binary32 values, as the
    kernels do: each condition holds for both keys there, and a float64 reference scaled the
    second key down (or both, for floor)."""
    source = (
        "variant v { param p: f32 = 16777216.0; param r: f32 = -0.25;\n"
        f"  param s: f32 = 16777216.0;\n  score = {score}; }}"
    )
    _keeps_every_key(source, 2, **({"p": 8388608.0} if score.startswith("floor") else {}))


@pytest.mark.parametrize("batch", [1.7, True, "1", -1, None])
def test_request_reference_checks_batch(batch: object) -> None:
    """``batch=1.7`` and ``batch=True`` ran as request 1, ``batch="1"`` failed with a bare
    comparison TypeError: each is now a ValueError naming ``batch``."""
    q, k, v = inputs(4, 4, 2, 1, 8)
    windows = attnc.load("stdlib:per_request_window")
    with pytest.raises(ValueError, match="^batch: "):
        request_reference(windows, q, k, v, window=[1, 100], batch=batch)
