#!/usr/bin/env bash
# Builds the fixture prefill modules and the harness for sm_90a, runs the correctness check,
# then the 8K timings. Usage: tests/gpu/kernel_harness/run.sh [BUILD_DIR] [--no-bench]
# Needs nvcc and a Hopper GPU; builds in parallel on all cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="${1:-$root/build/kernel_harness}"
bench=1
[[ "${2:-}" == "--no-bench" ]] && bench=0
mkdir -p "$build"
NVCC="${NVCC:-nvcc}"
arch="-gencode=arch=compute_90a,code=sm_90a"
inc="-I$root/attnc/kernels/include -I$root/tests/codegen/fixtures"
flags="-std=c++17 -O3 $arch -Xcompiler -fPIC -shared $inc"

modules=()
for d in 64 128 256; do
  modules+=("Causal bf16 $d" "Causal fp16 $d")
  for f in SoftCap Alibi SlidingWindow Sigmoid Vanilla; do
    if [[ $d == 128 ]]; then modules+=("$f bf16 $d"); else modules+=("$f fp16 $d"); fi
  done
done

build_one() {
  local f=$1 t=$2 d=$3
  local dt=__nv_bfloat16
  [[ $t == fp16 ]] && dt=half
  "$NVCC" $flags -DATTNC_FIXTURE="$f" -DATTNC_DTYPE="$dt" -DATTNC_HEAD_DIM="$d" \
    "$root/tests/codegen/fixtures/prefill_module.cu" -o "$build/${f}_${t}_${d}.so"
}
export -f build_one
export NVCC flags root build

start=$(date +%s)
printf '%s\n' "${modules[@]}" | xargs -P "$(nproc)" -L 1 bash -c 'build_one $0 $1 $2'
"$NVCC" -std=c++17 -O2 $arch -I"$root/attnc/kernels/include" "$here/prefill_harness.cu" \
  -o "$build/prefill_harness" -ldl
echo "built ${#modules[@]} modules and the harness in $(( $(date +%s) - start )) s"

status=0
"$build/prefill_harness" "$build" || status=$?
if [[ $bench == 1 ]]; then
  "$build/prefill_harness" "$build" --bench
fi
exit $status
