#!/usr/bin/env bash
# Builds the fixture prefill modules of the Hopper template (sm_90a) and the harness, runs the
# correctness check, then the 8K timings next to the FA2 template's causal d=128 module.
# Usage: tests/gpu/kernel_harness/run_sm90.sh [BUILD_DIR] [--no-bench]
# Needs nvcc and a Hopper GPU; builds in parallel on all cores.
# EXTRA="name:-DFLAG=1 ..." also builds the causal bf16 d=128 module with each flag set (e.g.
# EXTRA="s3:-DATTNC_SM90_STAGES=3") and times it (timing experiments).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="${1:-$root/build/kernel_harness_sm90}"
bench=1
[[ "${2:-}" == "--no-bench" ]] && bench=0
mkdir -p "$build/sm90" "$build/fa2"
NVCC="${NVCC:-nvcc}"
arch="-gencode=arch=compute_90a,code=sm_90a"
inc_src="$root/attnc/kernels/include"
inc="-I$inc_src -I$root/tests/codegen/fixtures"
flags="-std=c++17 -O3 $arch -Xcompiler -fPIC -shared $inc"

modules=()
for d in 64 128 256; do
  modules+=("Causal bf16 $d" "Causal fp16 $d")
  for f in SoftCap Alibi SlidingWindow Sigmoid Vanilla; do
    if [[ $d == 128 ]]; then modules+=("$f bf16 $d"); else modules+=("$f fp16 $d"); fi
  done
done

build_one() {
  local f=$1 t=$2 d=$3 src=$4 out=$5
  local dt=__nv_bfloat16 extra=""
  [[ $t == fp16 ]] && dt=half
  # FA2 modules get the tile shapes the runtime builds for sm_90 (prefill_arch_flags).
  [[ $src == prefill_module.cu ]] && extra="-DATTNC_PREFILL_TUNE=1"
  "$NVCC" $flags $extra -DATTNC_FIXTURE="$f" -DATTNC_DTYPE="$dt" -DATTNC_HEAD_DIM="$d" \
    "$root/tests/codegen/fixtures/$src" -o "$out/${f}_${t}_${d}.so"
}
export -f build_one
export NVCC flags root build
for e in ${EXTRA:-}; do
  n=${e%%:*}
  mkdir -p "$build/$n"
  (flags="$flags ${e#*:}" build_one Causal bf16 128 prefill_sm90_module.cu "$build/$n") &
done

start=$(date +%s)
{
  for m in "${modules[@]}"; do echo "$m prefill_sm90_module.cu $build/sm90"; done
  if [[ $bench == 1 ]]; then
    for m in "Causal bf16 128" "SoftCap bf16 128" "Alibi bf16 128" "SlidingWindow bf16 128" \
             "Sigmoid bf16 128" "Causal bf16 64" "Causal bf16 256"; do
      echo "$m prefill_module.cu $build/fa2"
    done
  fi
} | xargs -P "$(nproc)" -L 1 bash -c 'build_one $0 $1 $2 $3 $4'
wait
"$NVCC" -std=c++17 -O2 $arch -I"$inc_src" "$here/prefill_harness.cu" \
  -o "$build/prefill_harness" -ldl
echo "built in $(( $(date +%s) - start )) s"

status=0
timeout 300 "$build/prefill_harness" "$build/sm90" || status=$?
if [[ $bench == 1 ]]; then
  echo "== Hopper template (sm90)"
  timeout 120 "$build/prefill_harness" "$build/sm90" --bench || status=$?
  echo "== FA2 template"
  timeout 120 "$build/prefill_harness" "$build/fa2" --bench || status=$?
  for e in ${EXTRA:-}; do
    echo "== Hopper template with ${e#*:}"
    timeout 60 "$build/prefill_harness" "$build/${e%%:*}" --bench-causal128 || status=$?
  done
fi
exit $status
