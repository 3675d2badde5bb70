#!/usr/bin/env bash
# Decode kernel configurations side by side on one H200: builds every configuration of
# bench.py in parallel (each in its own JIT cache), then times them one after another.
# Usage: tests/gpu/decode_harness/run.sh OUTDIR [CONFIG ...]   (default: all configurations)
# Needs PYTHONPATH with attnc's dependencies; writes OUTDIR/build_*.log, OUTDIR/bench_*.log
# and OUTDIR/summary.txt.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:?usage: run.sh OUTDIR [CONFIG ...]}"
shift
configs=("$@")
[[ ${#configs[@]} -eq 0 ]] && configs=(new nocross l2_256 l2_128)
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export DECODE_HARNESS_CACHE="${DECODE_HARNESS_CACHE:-$out/cache}"
cd "$root"
start=$(date +%s)
pids=()
for c in "${configs[@]}"; do
  python "$here/bench.py" "$c" --build-only > "$out/build_$c.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "built ${configs[*]} in $(( $(date +%s) - start )) s" | tee "$out/summary.txt"
for c in "${configs[@]}"; do
  tail -n 3 "$out/build_$c.log"
  timeout 120 python "$here/bench.py" "$c" 2>&1 | tee "$out/bench_$c.log" | grep -E "TB/s|Error|error" | tee -a "$out/summary.txt"
done
echo "total $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
