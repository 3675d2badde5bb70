"""attnc::poly_exp2 (attnc/poly_exp2.cuh: exp2 on the FMA units, which the Hopper consumers use
for a share of the softmax weights when the score already costs a special-function op per
element) on the CPU against fp64: relative error below 8e-5 from -126 to the rescale slack,
exactly 0 for -inf and below -127 (a hidden key must weigh nothing: a row of hidden keys is
told by its zero sum), NaN kept (a NaN score the mask keeps must reach the output)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS


@pytest.fixture(scope="module")
def host_binary(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("poly_exp2") / "poly_exp2_host"
    build_host_fixture("poly_exp2_host.cu", out)
    return out


def poly_exp2(binary: Path, xs: list[float]) -> np.ndarray:
    text = "\n".join([str(len(xs))] + [float(np.float32(x)).hex() for x in xs])
    out = subprocess.run([binary], input=text, capture_output=True, text=True, check=True)
    return np.array([float.fromhex(v) if "0x" in v else float(v) for v in out.stdout.split()])


def test_relative_error_over_the_softmax_range(host_binary):
    rng = np.random.default_rng(0)
    xs = np.concatenate([
        np.linspace(-126.0, 8.0, 20001),
        rng.uniform(-30.0, 8.0, 20000),
        np.arange(-126, 9) + 0.5,  # the fraction at its ends
        np.arange(-126, 9, dtype=np.float64),  # integers: f = 0
    ]).astype(np.float32)  # fmt: skip
    got = poly_exp2(host_binary, xs.tolist())
    want = np.exp2(xs.astype(np.float64))
    rel = np.abs(got - want) / want
    assert rel.max() < 8e-5, float(xs[np.argmax(rel)])


def test_hidden_keys_weigh_exactly_zero(host_binary):
    xs = [-math.inf, -127.0, -127.4, -200.0, -3.0e38]
    assert (poly_exp2(host_binary, xs) == 0.0).all()


def test_nan_stays_nan(host_binary):
    assert np.isnan(poly_exp2(host_binary, [math.nan, -math.nan])).all()


def test_it_is_monotone_across_integer_steps(host_binary):
    """The bits of 2^j and the polynomial meet without a step backwards at each x = j + 1/2
    (a weight must not fall as its score rises, or the row max stops bounding the weights)."""
    eps = np.float32(2.0**-10)
    xs = [x + d for x in np.arange(-120, 8) + 0.5 for d in (-eps, 0.0, eps)]
    got = poly_exp2(host_binary, [float(x) for x in xs]).reshape(-1, 3)
    assert (np.diff(got, axis=1) >= 0).all()
