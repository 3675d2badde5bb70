#!/usr/bin/env bash
# Profiles one launch of the Hopper prefill kernel with Nsight Compute's source counters and
# exports what benchmarks/ncu_sass_groups.py reads: TAG.sass.csv (the SASS page, per
# instruction: executions, stall samples and reasons) and TAG.details.txt (speed of light,
# scheduler, warp state and instruction statistics). The command must launch the kernel at
# least four times (the fourth is profiled), e.g. `benchmarks.timing_probe --ncu`.
#   usage: scripts/ncu_sass.sh TAG COMMAND...   (files go to $OUT, else the current folder)
set -euo pipefail
if [ "$#" -lt 2 ]; then
    echo "usage: scripts/ncu_sass.sh TAG COMMAND..." >&2
    exit 2
fi
tag=$1
shift
case "$tag" in
    "" | *[!A-Za-z0-9_.-]*)
        printf "TAG must be letters, digits, '_', '.' or '-', got %q\n" "$tag" >&2
        exit 2 ;;
esac
dest="${OUT:-.}"
ncu_bin="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
report="$(mktemp -d)/$tag"
"$ncu_bin" --kernel-name regex:prefill_sm90 --launch-skip 3 --launch-count 1 \
    --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section InstructionStats --section SchedulerStats \
    -o "$report" "$@"
"$ncu_bin" -i "$report.ncu-rep" --page source --csv --print-source sass > "$dest/$tag.sass.csv"
"$ncu_bin" -i "$report.ncu-rep" --page details > "$dest/$tag.details.txt"
