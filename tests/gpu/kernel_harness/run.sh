#!/usr/bin/env bash
# Builds the fixture prefill modules and the harness for sm_90a, runs the correctness check,
# then the 8K timings. Usage: tests/gpu/kernel_harness/run.sh [BUILD_DIR] [--no-bench]
# Needs nvcc and a Hopper GPU; builds in parallel on all cores.
# TUNE="1 2" (the default; TUNE="" for none) also checks and times module sets built with the
# alternative Large tile shapes ATTNC_PREFILL_TUNE=1, 2 (see prefill_config.cuh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="${1:-$root/build/kernel_harness}"
bench=1
[[ "${2:-}" == "--no-bench" ]] && bench=0
mkdir -p "$build"
NVCC="${NVCC:-nvcc}"
arch="-gencode=arch=compute_90a,code=sm_90a"
inc_src="$root/attnc/kernels/include"
inc="-I$inc_src -I$root/tests/codegen/fixtures"
flags="-std=c++17 -O3 $arch -Xcompiler -fPIC -shared $inc"
tunes="${TUNE-1 2}"

modules=()
for d in 64 128 256; do
  modules+=("Causal bf16 $d" "Causal fp16 $d")
  for f in SoftCap Alibi SlidingWindow Sigmoid Vanilla; do
    if [[ $d == 128 ]]; then modules+=("$f bf16 $d"); else modules+=("$f fp16 $d"); fi
  done
done

base_modules=("${modules[@]}")
for n in $tunes; do
  for m in "${base_modules[@]}"; do modules+=("$m $n"); done
done

build_one() {
  local f=$1 t=$2 d=$3 n=${4:-}
  local dt=__nv_bfloat16 out="$build"
  [[ $t == fp16 ]] && dt=half
  if [[ -n $n ]]; then out="$build/tune$n"; mkdir -p "$out"; fi
  "$NVCC" $flags -DATTNC_FIXTURE="$f" -DATTNC_DTYPE="$dt" -DATTNC_HEAD_DIM="$d" \
    ${n:+-DATTNC_PREFILL_TUNE=$n} \
    "$root/tests/codegen/fixtures/prefill_module.cu" -o "$out/${f}_${t}_${d}.so"
}
export -f build_one
export NVCC flags root build

start=$(date +%s)
printf '%s\n' "${modules[@]}" | xargs -P "$(nproc)" -L 1 bash -c 'build_one $0 $1 $2 $3'
"$NVCC" -std=c++17 -O2 $arch -I"$inc_src" "$here/prefill_harness.cu" \
  -o "$build/prefill_harness" -ldl
echo "built ${#modules[@]} modules and the harness in $(( $(date +%s) - start )) s"

status=0
"$build/prefill_harness" "$build" || status=$?
for n in $tunes; do
  echo "correctness, tile shapes ATTNC_PREFILL_TUNE=$n:"
  "$build/prefill_harness" "$build/tune$n" | tail -1 || status=1
done
if [[ $bench == 1 ]]; then
  "$build/prefill_harness" "$build" --bench
  for n in $tunes; do
    echo "tile shapes ATTNC_PREFILL_TUNE=$n:"
    "$build/prefill_harness" "$build/tune$n" --bench
  done
fi
exit $status
