"""attnc/exp2_poly.cuh (the exp2 the Hopper consumers compute on the FMA pipe for part of the
softmax weights of scores with transcendental functions) on the CPU against exp2 in fp64:
within 7.5e-5 relative over (-126.5, 127.5], exactly 0 at and below -126.5 and for -inf (a
row whose keys are all masked must sum to exactly 0), +inf above 127.5 (1 / (1 + 2^y) of a
sigmoid then gives 0), NaN for NaN."""

from __future__ import annotations

import math
import subprocess

import numpy as np
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

REL_ERROR = 7.5e-5


def _exp2_poly(binary, xs: np.ndarray) -> np.ndarray:
    text = "\n".join(float(x).hex() for x in xs.astype(np.float32).tolist()) + "\n"
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split()
    assert len(lines) == len(xs)
    return np.array([float.fromhex(line) if "nan" not in line else math.nan for line in lines])


def test_exp2_poly_matches_exp2(tmp_path):
    binary = build_host_fixture("exp2_poly_host.cu", tmp_path / "exp2_poly_host")
    rng = np.random.default_rng(3)
    near_integers = np.arange(-126, 128)[:, None] + np.array([-0.5, -0.25, 0.0, 0.25, 0.4999])
    xs = np.concatenate([
        np.linspace(-126.4999, 127.5, 200001),
        rng.uniform(-30.0, 10.0, 100000),
        near_integers.reshape(-1)[near_integers.reshape(-1) > -126.5],
        np.nextafter(np.float32([0.5, -0.5, 1.5]), np.float32(0)),
    ]).astype(np.float32)  # fmt: skip
    got = _exp2_poly(binary, xs)
    want = np.exp2(xs.astype(np.float64))
    rel = np.abs(got / want - 1.0)
    worst = int(np.argmax(rel))
    assert rel[worst] <= REL_ERROR, (float(xs[worst]), got[worst], want[worst])


def test_exp2_poly_ends_are_exact(tmp_path):
    binary = build_host_fixture("exp2_poly_host.cu", tmp_path / "exp2_poly_host")
    zeros = np.float32([-np.inf, -1e30, -1000.0, -128.0, -127.0, -126.75, -126.5])
    got = _exp2_poly(binary, zeros)
    assert np.all(got == 0.0), got
    assert np.all(np.signbit(got) == False)  # noqa: E712 (+0, not -0)
    infs = _exp2_poly(binary, np.float32([127.5001, 128.0, 200.0, 1e30, np.inf]))
    assert np.all(infs == np.inf), infs
    nans = _exp2_poly(binary, np.float32([np.nan, -np.nan]))
    assert np.all(np.isnan(nans))
    assert _exp2_poly(binary, np.float32([0.0]))[0] == np.float32(0.99992806)
