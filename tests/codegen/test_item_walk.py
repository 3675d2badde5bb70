"""The Hopper prefill's alternating item walk (attnc/sm90/item_order.cuh), followed on the CPU
as its producer follows it: across the CTAs every item runs exactly once, each CTA's items are
those of the oracle below (round r: item r * g + b, or r * g + g - 1 - b in odd rounds), and
a CTA stops at the first item past the list."""

from __future__ import annotations

import subprocess

from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

CASES = [(n, g) for g in (1, 2, 3, 7, 132) for n in (0, 1, g - 1, g, g + 1, 2 * g, 5 * g + 3, 1000)]


def _oracle(num_work: int, ctas: int) -> list[list[int]]:
    out = []
    for b in range(ctas):
        items, r = [], 0
        while True:
            w = r * ctas + (ctas - 1 - b if r % 2 else b)
            if w >= num_work:
                break
            items.append(w)
            r += 1
        out.append(items)
    return out


def test_alternating_walk_runs_every_item_once(tmp_path):
    binary = build_host_fixture("item_walk_host.cu", tmp_path / "item_walk_host")
    cases = CASES
    text = "".join(f"{n} {g}\n" for n, g in cases)
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(cases)
    for (n, g), line in zip(cases, lines, strict=True):
        walks = [[int(x) for x in part.split()] for part in line.split("|")[:-1]]
        assert walks == _oracle(n, g), (n, g)
        assert sorted(w for walk in walks for w in walk) == list(range(n)), (n, g)
