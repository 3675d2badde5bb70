"""Specs the compiler used to choke on: a guard shared through a chain of lets (time doubled
per level), a power past the converter's limit in an affine score (an internal exception), a
float literal whose exponent decimal cannot hold (an internal exception), and an f32 ``%``
whose float32 torch form gave NaN in the reference, and a long chain of guards (quadratic).
Each failed before its fix."""

from __future__ import annotations

import pytest
import torch

from attnc.compiler import index_bounds
from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import AttnError
from attnc.dsl.literals import f32_literal


def _shared_guards(depth: int) -> str:
    lets = "\n".join(f"    let a{i + 1} = a{i} && a{i};" for i in range(depth))
    return (
        "variant v {\n    param t: tensor<f32>[8];\n    let a0 = kv_idx < 8;\n"
        f"{lets}\n    score = a{depth} ? score + t[kv_idx] : score;\n}}\n"
    )


def _count_learns(monkeypatch) -> list[int]:
    """A counter of the index checks' ``_learn`` calls (one per condition visited)."""
    calls = [0]
    learn = index_bounds._learn

    def counted(*args):
        calls[0] += 1
        return learn(*args)

    monkeypatch.setattr(index_bounds, "_learn", counted)
    return calls


def test_a_guard_shared_through_lets_is_learned_once_per_node(monkeypatch) -> None:
    """``let a{i+1} = a{i} && a{i}`` visited every path of the DAG: 2^depth calls."""
    calls = _count_learns(monkeypatch)
    (compiled,), warnings = compile_source(_shared_guards(14), "dag.attn")
    assert calls[0] < 1000, calls[0]  # 2^14 = 16384 before
    assert not warnings  # the shared guard still proves t[kv_idx] (kv_idx < 8)


def test_a_chain_of_guards_learns_each_term_once(monkeypatch) -> None:
    """Each term of ``c1 && c2 && ... && cn`` is the guard of the next: its prefixes were
    learned again for every later term (n^2 / 2 calls; 1500 terms took a minute)."""
    calls = _count_learns(monkeypatch)
    terms = " && ".join(f"kv_idx + {i} <= q_pos + {2 * i}" for i in range(200))
    source = (
        f"variant v {{\n    param t: tensor<f32>[8];\n    mask = {terms};\n"
        "    score = kv_idx < 8 ? score + t[kv_idx] : score;\n}\n"
    )
    compile_source(source, "chain.attn")
    assert calls[0] < 5000, calls[0]  # 39603 before


@pytest.mark.parametrize(
    "score", ["score * " + "*".join(["f"] * 17), "score + " + "*".join(["f"] * 17)]
)
def test_a_power_past_the_converters_limit_leaves_the_score_as_written(score) -> None:
    """A 17th power of one factor raised the converter's private exception."""
    source = f"variant v {{\n    param f: f32;\n    score = {score};\n}}\n"
    (compiled,), _ = compile_source(source, "pow.attn")
    assert compiled.affine is None  # evaluated per element, as written


def test_float_literals_past_decimals_exponent_range() -> None:
    """``decimal.Decimal`` refuses exponents of 10^18 and more (InvalidOperation)."""
    assert f32_literal("0e1000000000000000000") == 0.0
    assert f32_literal("1e-1000000000000000000") == 0.0
    assert f32_literal("1e1000000000000000000") is None
    source = "variant v { score = score + 1e1000000000000000000; }\n"
    with pytest.raises(AttnError, match="float literal '1e1000000000000000000' is out of range"):
        compile_source(source, "big.attn")


def test_the_reference_takes_f32_remainders_exactly() -> None:
    """torch's vectorised float32 fmod gives NaN where a / b overflows float32 (-3.4e38 % 0.1)
    or b is subnormal; C's fmodf, which the kernels use, gives the exact remainder."""
    import attnc

    v = attnc.load(source="variant v { param f: f32; score = score + (f - float(kv_idx)) % 0.1; }")
    q, k = torch.randn(3, 1, 64), torch.randn(70, 1, 64)
    out, lse = v.reference(q, k, k, f=-3.4e38, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    expected = torch.fmod(torch.tensor(-3.4e38, dtype=torch.float64), 0.1).float()
    assert expected != 0 and torch.isfinite(expected)
