"""The Hopper launcher's TMA boxes for paged KV (paged_box_rows), run on the CPU against brute
force: for stages of 64, 80 and 128 keys, a box is the largest number of rows that is a power
of two, divides both the page and the stage (so no box crosses a page and a stage is whole
boxes) and is at least 8 (the 128-byte swizzle atom); 0 (gather by cp.async) when there is
none."""

from __future__ import annotations

import subprocess

from host_fixture import NVCC_MARKS, build_host_fixture

pytestmark = NVCC_MARKS

PAGES = [1, 2, 4, 5, 7, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 100, 128, 160, 256, 1024, 4096]


def _oracle(page: int, keys: int) -> int:
    rows = [r for r in (8, 16, 32, 64, 128, 256) if page % r == 0 and keys % r == 0]
    return max(rows, default=0)


def test_box_rows_divide_page_and_stage(tmp_path):
    binary = build_host_fixture("paged_boxes_host.cu", tmp_path / "paged_boxes_host")
    text = "".join(f"{p}\n" for p in PAGES)
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    got = [[int(x) for x in line.split()] for line in run.stdout.splitlines()]
    want = [[_oracle(p, keys) for keys in (64, 80, 128)] for p in PAGES]
    assert got == want
    # The rule's cases named in docs/runtime.md: one box per page of 8 to 128 keys under 128-key
    # stages, 16-key boxes from 32- and 64-key pages under 80-key stages.
    by_page = dict(zip(PAGES, got, strict=True))
    assert [by_page[p][2] for p in (8, 16, 32, 64, 128)] == [8, 16, 32, 64, 128]
    assert by_page[32][1] == by_page[64][1] == 16
