"""The Hopper prefill kernel does not depend on its producer warps keeping pace with each other.

A producer warp that reached a stage's empty-barrier wait after the stage was issued could see
the consumers free it again, find the phase parity back where it started and wait for ever
(RESULTS.md run 38: the kernel hung once producer warps 1-3 started each item 4 us late). The
module is built with that lag injected (``ATTNC_SM90_PRODUCER_LAG_NS``) and the Hopper tests of
ragged, paged-by-TMA, gathered and split batches at head_dim 64, 128 and 256, and those of the
staged key values (test_staged_keys.py, where every producer thread waits for each stage) run
against the fp64 reference in a child process, so that a hang fails the test instead of
stalling the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the Hopper template needs an sm_90 GPU", allow_module_level=True)

HERE = Path(__file__).resolve().parent
SELECTED = (
    "test_ragged_batch_odd_lengths and causal"
    " or test_many_tma_tiles_then_a_gathered_tail"
    " or test_three_consumers_groups_paged_and_split and causal"
    " or test_head_dims_and_dtypes and causal"
    " or test_paged_tma_boxes and 8-NHD"
)


# The staged key values (test_staged_keys.py): every producer thread waits for a stage there.
STAGED = "test_staged_key_values_match_float64 and sm90"


def _child_pytest(*args: str, env: dict[str, str], timeout: int, file: str = "test_prefill_sm90.py",
                  select: str = SELECTED) -> subprocess.CompletedProcess:  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           str(HERE / file), "-k", select, *args]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


@pytest.mark.parametrize(
    "file, select", [("test_prefill_sm90.py", SELECTED), ("test_staged_keys.py", STAGED)]
)
def test_hopper_tests_pass_with_lagging_producer_warps(tmp_path, file, select):
    env = dict(os.environ)
    env["ATTNC_TEST_SM90_FLAGS"] = "-DATTNC_SM90_PRODUCER_LAG_NS=4000"
    listed = _child_pytest("--collect-only", env=env, timeout=300, file=file, select=select)
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert listed.returncode == 0 and ids, (listed.stdout + listed.stderr)[-4000:]
    try:
        run = _child_pytest(env=env, timeout=900, file=file, select=select)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Hopper tests with lagging producer warps hung (900 s): {e.stdout!r}")
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    # Every selected test ran and passed: none skipped, none deselected by a changed name.
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed is not None and int(passed.group(1)) == len(ids), tail
    assert "skipped" not in run.stdout, tail
