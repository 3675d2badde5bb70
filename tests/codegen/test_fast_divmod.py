"""attnc/fast_divmod.cuh (FastDiv: page sizes in the paged gathers, the GQA group in the Hopper
consumers) on the CPU against exact division: every dividend below 4096 for the divisors 1-64,
the ends of the range (0, 2^31 - 1 and the multiples of d around them) for divisors up to
2^31 - 1, and random pairs."""

from __future__ import annotations

import subprocess

import numpy as np
from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

TOP = 2**31 - 1


def _pairs() -> list[tuple[int, int]]:
    pairs = [(d, n) for d in range(1, 65) for n in range(4096)]
    divisors = [*range(1, 300), 2**16 - 1, 2**16, 2**16 + 1, 2**30 - 1, 2**30, 2**30 + 1, TOP]
    for d in divisors:
        top_multiple = TOP - TOP % d
        for n in (0, 1, d - 1, d, d + 1, TOP, TOP - 1, top_multiple, top_multiple - 1):
            if 0 <= n <= TOP:
                pairs.append((d, n))
    rng = np.random.default_rng(7)
    ds = rng.integers(1, TOP, size=20000, endpoint=True)
    ns = rng.integers(0, TOP, size=20000, endpoint=True)
    pairs += list(zip(ds.tolist(), ns.tolist(), strict=True))
    return pairs


def test_fast_divmod_matches_exact_division(tmp_path):
    binary = build_host_fixture("fast_divmod_host.cu", tmp_path / "fast_divmod_host")
    pairs = _pairs()
    text = "\n".join(f"{d} {n}" for d, n in pairs) + "\n"
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(pairs)
    bad = [(d, n, line) for (d, n), line in zip(pairs, lines, strict=True)
           if tuple(map(int, line.split())) != divmod(n, d)]  # fmt: skip
    assert not bad, bad[:10]
