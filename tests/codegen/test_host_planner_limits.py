"""The host planners' C entry points on inputs past their limits, each case in a child process
(a crash there fails the test instead of ending the run), under a cap on its address space
where the old code would allocate without end:

- the tile-map summary (``tile_map.summarize``, ``attnc_prefill_map_summary``) refuses lengths
  past the kernels' token limit and a map shorter than the batch needs, without the running
  map start wrapping (a crash on a wrapped start) or per-tile scratch being allocated (an
  abort); its tile and block are checked as ints (2**64 + 64 was taken as 64);
- no C++ exception leaves an entry: a plan whose scratch cannot be allocated is a
  ``MemoryError`` (it terminated the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from attnc.runtime.build import toolchain

pytestmark = pytest.mark.nvcc

try:
    toolchain.find_nvcc()
except toolchain.ToolNotFound:
    pytest.skip("nvcc not found", allow_module_level=True)

# The child's helpers: its address space capped at what it maps now plus 1 GiB.
PRELUDE = """
import resource
import numpy as np
import torch

def cap_memory(extra=1 << 30):
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))

def outcome(call):
    try:
        call()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("returned")
"""

SUMMARY = """
from attnc.runtime.planning import prefill_plan_library, tile_map
prefill_plan_library.library()
cap_memory()
outcome(lambda: tile_map.summarize(np.zeros(64, np.uint8), np.array({q}), np.array({kv}), {tile}, 1))
"""

MAX = (1 << 31) - (1 << 16)  # the kernels' tokens per request (dsl/limits.py)
NO_SCRATCH = "the host planner could not allocate its scratch"


def _child(code: str) -> str:
    """What the child running ``code`` (after PRELUDE) prints; it must exit normally."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.strip()


@pytest.mark.parametrize(
    ("q", "kv", "tile", "message"),
    [
        # 4 rows of 2**62 columns: the start wrapped to 0 and passed for a 64-byte map
        ([4], [1 << 62], 1, f"the lengths must be from 0 to {MAX}"),
        ([1 << 40], [1], 1, f"the lengths must be from 0 to {MAX}"),
        ([MAX + 1], [0], 1, f"the lengths must be from 0 to {MAX}"),
        # within the limit: 3 * 2**62 entries; the running start is checked before each add
        ([MAX] * 3, [MAX] * 3, 1, "the map as long as the batch needs"),
        # taken as 64 by ctypes: a summary of a map of one 64-token tile
        ([64], [64], 2**64 + 64, "tile_q_tokens: must be in [1, 2147483647], got"),
    ],
)
def test_the_map_summary_refuses_what_it_cannot_hold(q, kv, tile, message):
    got = _child(SUMMARY.format(q=q, kv=kv, tile=tile))
    assert got.startswith("ValueError") and message in got, got


def test_a_prefill_plan_without_memory_for_its_scratch():
    """2**31 one-token query tiles: 16 GiB per per-tile array, past the cap."""
    got = _child(f"""
        from attnc.runtime.planning.prefill_planner import PrefillPlanner
        planner = PrefillPlanner()
        qo = torch.tensor([0, {MAX}], dtype=torch.int32)
        assert planner.check(qo, qo, None, None, 1)
        planner.configure(4, 4, 64, 1, 132, 1 << 62)
        cap_memory()
        outcome(planner.plan)
    """)
    assert got == f"MemoryError attnc: prefill plan: {NO_SCRATCH}"


def test_a_decode_plan_without_memory_for_its_scratch():
    """A plan of 2**28 requests: 2 GiB of chunk counts per candidate, past the cap."""
    got = _child("""
        from attnc.runtime.planning.decode_plan import DecodePlanner
        from attnc.runtime.planning.workspace import make_layout
        layout = make_layout(64 << 20, 64, 16384, 1056, None)
        planner = DecodePlanner(np.zeros(layout.work_bytes(layout.max_items), np.uint8), layout)
        planner.configure(1, 32, 8, 1, 264, 64, layout.max_part_rows(128), 16, None)
        p = planner.params()
        kv = np.zeros(4, np.int64)
        p.batch, p.kv_lens = 1 << 28, kv.ctypes.data
        cap_memory()
        outcome(lambda: planner.plan_params(p))
    """)
    assert got == f"MemoryError attnc: decode plan: {NO_SCRATCH}"
