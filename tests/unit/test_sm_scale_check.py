"""sm_scale is checked once, at plan(): a finite number > 0 (the kernels keep the running max
of raw dot products for the plain scaled dot product, which is the logits' max only for a
positive scale; on an H200 a scale of 0 or below gave NaN output there, NaN or inf NaN
everywhere). The prefill wrapper rejects a bad scale before it builds anything."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.checks.tensors import check_sm_scale

BAD = [0.0, -0.0, -0.0884, -1.0, math.nan, math.inf, -math.inf, 1e400]


def test_default_is_one_over_sqrt_head_dim() -> None:
    assert check_sm_scale(None, 128) == 1.0 / math.sqrt(128)
    assert check_sm_scale(None, 64) == 0.125


@pytest.mark.parametrize("value", [0.0884, 1, 10.0, 1e-30, np.float32(0.5), torch.tensor(0.25)])
def test_finite_positive_scales_pass_as_floats(value) -> None:
    out = check_sm_scale(value, 128)
    assert type(out) is float and out == float(value)


@pytest.mark.parametrize("value", BAD)
def test_zero_negative_and_non_finite_scales_are_rejected(value) -> None:
    with pytest.raises(ValueError, match=r"^sm_scale: must be a finite number > 0, got "):
        check_sm_scale(value, 128)


@pytest.mark.parametrize("value", [True, "0.1", b"1", [0.1], torch.ones(2), object()])
def test_non_numbers_are_rejected(value) -> None:
    with pytest.raises(ValueError, match=r"^sm_scale: expected a float, got "):
        check_sm_scale(value, 128)


@pytest.mark.parametrize("value", [-0.0884, 0.0, math.nan])
def test_prefill_plan_rejects_a_bad_scale_before_building(value, monkeypatch) -> None:
    w = attnc.BatchPrefillWrapper(
        attnc.load("stdlib:causal"), torch.empty(1 << 20, dtype=torch.uint8)
    )

    def no_builds(*args, **kwargs):
        raise AssertionError("plan() built a module before checking sm_scale")

    monkeypatch.setattr(w, "_first_builds", no_builds)
    indptr = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="sm_scale"):
        w.plan(indptr, indptr, 4, 2, 128, sm_scale=value)


@pytest.mark.parametrize("value", [True, "0.1", "abc", [0.1], torch.ones(2)])
def test_the_reference_names_a_scale_that_is_not_a_number(value) -> None:
    """The eager reference takes any number (NaN, 0 and negative scales included), but a
    string ended in float()'s bare "could not convert string to float", "0.1" was read as
    0.1 and True as 1.0."""
    q = torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match=r"^sm_scale: expected a float, got "):
        attnc.load("stdlib:causal").reference(q, q, q, sm_scale=value)


@pytest.mark.parametrize("value", [-0.5, 0.0, math.nan, np.float32(0.25), torch.tensor(0.25)])
def test_the_reference_takes_any_number(value) -> None:
    q = torch.randn(3, 2, 64, dtype=torch.float64)
    out = attnc.load("stdlib:vanilla").reference(q, q, q, sm_scale=value)
    scores = torch.einsum("qhd,khd->hqk", q, q) * float(value)
    want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), q)
    torch.testing.assert_close(out, want, equal_nan=True)
