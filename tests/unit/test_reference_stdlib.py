"""Variant.reference of every stdlib variant against attention written directly in torch."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import attnc
from attnc.compiler.pipeline import stdlib_names

# (q_len, kv_len, num_qo_heads, num_kv_heads, head_dim)
SHAPES = [
    (5, 9, 4, 2, 16),  # q_len < kv_len, GQA group 2
    (7, 7, 4, 4, 8),  # q_len == kv_len, group 1
    (1, 11, 8, 2, 32),  # decode-like, group 4
    (6, 13, 4, 1, 16),  # group 4, one KV head
    (9, 5, 2, 1, 8),  # q_len > kv_len: the first rows see no key under causal masks
]


def alibi_slopes(h: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float32)


def expected(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float | None,
    score: Callable | None = None,
    mask: Callable | None = None,
    softmax: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [q_len, H, D] and natural-log LSE [q_len, H], computed in float64."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, h, d = q.shape
    kv_len, hk, _ = k.shape
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    group = h // hk
    # query head i reads KV head i // group
    kv_head = torch.arange(h) // group
    kx, vx = k[:, kv_head, :], v[:, kv_head, :]
    s = torch.einsum("qhd,khd->hqk", q, kx) * scale
    head = torch.arange(h).view(h, 1, 1)
    q_pos = (torch.arange(q_len) + kv_len - q_len).view(1, q_len, 1)
    kv = torch.arange(kv_len).view(1, 1, kv_len)
    if score is not None:
        s = score(s, head, q_pos, kv)
    keep = torch.ones_like(s, dtype=torch.bool)
    if mask is not None:
        keep = mask(q_pos, kv).expand_as(s)
    if not softmax:
        w = torch.where(keep, s, torch.zeros_like(s))
        out = torch.einsum("hqk,khd->qhd", w, vx)
        return out, torch.zeros(q_len, h, dtype=torch.float64)
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # -inf where a row sees no key
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.where(keep, p, torch.zeros_like(p))
    out = torch.einsum("hqk,khd->qhd", p, vx)
    return out, lse.transpose(0, 1)


def causal(q_pos, kv):
    return kv <= q_pos


CASES: dict[str, list[tuple[dict, Callable]]] = {
    "vanilla": [({}, lambda q, k, v, s, p: expected(q, k, v, s))],
    "causal": [({}, lambda q, k, v, s, p: expected(q, k, v, s, mask=causal))],
    "softcap": [
        (
            {},
            lambda q, k, v, s, p: expected(
                q, k, v, s, score=lambda x, h, qp, kv: 50.0 * torch.tanh(x / 50.0), mask=causal
            ),
        ),
        (
            {"cap": 0.75},
            lambda q, k, v, s, p: expected(
                q, k, v, s, score=lambda x, h, qp, kv: 0.75 * torch.tanh(x / 0.75), mask=causal
            ),
        ),
    ],
    "alibi": [
        (
            {"slopes": None},
            lambda q, k, v, s, p: expected(
                q,
                k,
                v,
                s,
                score=lambda x, h, qp, kv: x + p["slopes"].double()[h] * (kv - qp),
                mask=causal,
            ),
        )
    ],
    "sliding_window": [
        (
            {"window": w},
            lambda q, k, v, s, p: expected(
                q, k, v, s, mask=lambda qp, kv: (kv <= qp) & (qp - kv < p["window"])
            ),
        )
        for w in (3, 1, 0, 100)
    ],
    "prefix_lm": [
        (
            {"prefix_len": n},
            lambda q, k, v, s, p: expected(
                q, k, v, s, mask=lambda qp, kv: (kv < p["prefix_len"]) | (kv <= qp)
            ),
        )
        for n in (0, 3, 20)
    ],
    "sigmoid": [
        (
            {},
            lambda q, k, v, s, p: expected(
                q, k, v, s, score=lambda x, h, qp, kv: torch.sigmoid(x), softmax=False
            ),
        ),
        (
            {"bias": -0.5},
            lambda q, k, v, s, p: expected(
                q, k, v, s, score=lambda x, h, qp, kv: torch.sigmoid(x - 0.5), softmax=False
            ),
        ),
    ],
}


def test_every_stdlib_variant_has_a_hand_written_reference() -> None:
    from tests.unit.test_reference_v2 import V2_STDLIB  # checked by brute force there

    assert sorted(CASES) == sorted(n for n in stdlib_names() if n not in V2_STDLIB)


def inputs(shape, dtype=torch.float64, seed=0):
    q_len, kv_len, h, hk, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(kv_len, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(kv_len, hk, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def concrete(params: dict, h: int) -> dict:
    return {n: (alibi_slopes(h) if n == "slopes" else x) for n, x in params.items()}


def assert_close_exact(got: torch.Tensor, ref: torch.Tensor, tol: float = 1e-10) -> None:
    assert got.shape == ref.shape
    inf_got, inf_ref = torch.isinf(got), torch.isinf(ref)
    assert torch.equal(inf_got, inf_ref)
    assert torch.equal(got[inf_got], ref[inf_ref])
    assert not torch.isnan(got).any()
    finite = ~inf_ref
    if finite.any():
        assert (got[finite] - ref[finite]).abs().max().item() < tol


ALL = [
    (name, i, params, fn) for name, cases in CASES.items() for i, (params, fn) in enumerate(cases)
]


@pytest.mark.parametrize("name, i, params, fn", ALL, ids=[f"{a[0]}-{a[1]}" for a in ALL])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("sm_scale", [None, 0.3])
def test_float64_matches_hand_written(name, i, params, fn, shape, sm_scale) -> None:
    variant = attnc.load(f"stdlib:{name}")
    q, k, v = inputs(shape, seed=i)
    p = concrete(params, shape[2])
    out, lse = variant.reference(q, k, v, sm_scale=sm_scale, return_lse=True, **p)
    ref_out, ref_lse = fn(q, k, v, sm_scale, p)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert_close_exact(out, ref_out)
    assert_close_exact(lse, ref_lse)
    plain = variant.reference(q, k, v, sm_scale=sm_scale, **p)
    assert torch.equal(plain, out)


def test_window_zero_masks_every_row() -> None:
    q, k, v = inputs((4, 6, 2, 1, 8))
    out, lse = attnc.load("stdlib:sliding_window").reference(q, k, v, window=0, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full((4, 2), -math.inf, dtype=torch.float64))


def test_causal_rows_before_the_kv_start_are_empty() -> None:
    q, k, v = inputs((9, 5, 2, 1, 8))
    out, lse = attnc.load("stdlib:causal").reference(q, k, v, return_lse=True)
    # q_pos = q_idx - 4: rows 0..3 see no key
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    assert torch.isinf(lse[:4]).all() and (lse[:4] < 0).all()
    assert torch.isfinite(lse[4:]).all()


def test_sigmoid_lse_is_zero() -> None:
    q, k, v = inputs((5, 9, 4, 2, 16))
    _, lse = attnc.load("stdlib:sigmoid").reference(q, k, v, return_lse=True)
    assert torch.equal(lse, torch.zeros(5, 4, dtype=torch.float64))


def test_default_sm_scale_is_inverse_sqrt_head_dim() -> None:
    q, k, v = inputs((5, 9, 4, 2, 16))
    variant = attnc.load("stdlib:vanilla")
    assert torch.equal(variant.reference(q, k, v), variant.reference(q, k, v, sm_scale=0.25))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_low_precision_close_to_float64(name, dtype, tol) -> None:
    params, fn = CASES[name][-1]
    shape = (6, 13, 4, 2, 32)
    q, k, v = inputs(shape, dtype=dtype, seed=3)
    p = concrete(params, shape[2])
    out, lse = attnc.load(f"stdlib:{name}").reference(q, k, v, return_lse=True, **p)
    assert out.dtype == dtype
    assert lse.dtype == torch.float32
    # the float64 reference of the same (rounded) inputs
    ref_out, ref_lse = fn(q, k, v, None, p)
    err = (out.double() - ref_out).norm() / ref_out.norm()
    assert err.item() < tol
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item()
    assert lse_err < (1e-5 if dtype == torch.float32 else 1e-2)


def test_lse_is_natural_log_of_denominator() -> None:
    q, k, v = inputs((3, 4, 1, 1, 4))
    _, lse = attnc.load("stdlib:vanilla").reference(q, k, v, sm_scale=1.0, return_lse=True)
    s = torch.einsum("qd,kd->qk", q[:, 0], k[:, 0])
    assert_close_exact(lse[:, 0], torch.log(torch.exp(s).sum(-1)), tol=1e-12)


QKV = inputs((3, 4, 2, 1, 8), dtype=torch.float32)
PARAM_ERRORS = [
    ("alibi", {}, "variant 'alibi': missing param 'slopes' (tensor<f32>[num_qo_heads])"),
    ("sliding_window", {}, "variant 'sliding_window': missing param 'window' (i32)"),
    ("softcap", {"cpa": 1.0}, "variant 'softcap': unknown param 'cpa'; did you mean 'cap'?"),
    ("vanilla", {"x": 1}, "variant 'vanilla': unknown param 'x'; this variant takes no params"),
    (
        "sliding_window",
        {"window": 1.5},
        "variant 'sliding_window': param 'window' (i32): expected an int, got float",
    ),
    ("softcap", {"cap": "x"}, "variant 'softcap': param 'cap' (f32): expected a float, got str"),
    (
        "prefix_lm",
        {"prefix_len": True},
        "variant 'prefix_lm': param 'prefix_len' (i32): expected an int, got bool",
    ),
    (
        "alibi",
        {"slopes": torch.ones(2, dtype=torch.float64)},
        "variant 'alibi': param 'slopes' (tensor<f32>[num_qo_heads]): expected dtype "
        "torch.float32, got torch.float64 (no implicit casts)",
    ),
    (
        "alibi",
        {"slopes": torch.ones(3)},
        "variant 'alibi': param 'slopes' (tensor<f32>[num_qo_heads]): expected shape [2], got [3]",
    ),
]


@pytest.mark.parametrize("name, params, message", PARAM_ERRORS)
def test_param_errors(name, params, message) -> None:
    with pytest.raises(ValueError) as info:
        attnc.load(f"stdlib:{name}").reference(*QKV, **params)
    assert str(info.value) == message
