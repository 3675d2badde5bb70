#!/usr/bin/env bash
# Profiles the Hopper prefill kernel of one planned run() with Nsight Compute (one launch):
# speed of light, compute and memory workload, warp states and their stall reasons.
#   usage: scripts/ncu_prefill.sh [ROW] [OUTFILE]   (ROW as in benchmarks.timing_probe --rows;
#   a fa3/ row profiles FlashInfer's FA3 kernel instead)
set -euo pipefail
row="${1:-causal:8192:128}"
out="${2:-ncu_prefill.txt}"
ncu_bin="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
kernel=prefill_sm90
case "$row" in fa3/*) kernel=PrefillWithKVCache ;; esac
"$ncu_bin" --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section Occupancy --section LaunchStats \
    python3 -m benchmarks.timing_probe --rows "$row" --ncu > "$out" 2>&1
