#!/usr/bin/env bash
# One call on the GPU machine: install carried wheels, run the GPU tests, run the benchmarks,
# print the markdown tables last.
#
# Environment:
#   OUT                 output folder (default ./gpu_out); keep few files here
#   ATTNC_SKIP_TESTS=1  skip the pytest GPU tests
#   ATTNC_SUITES        benchmark suites, e.g. "prefill decode" (default: prefill)
#   ATTNC_QUICK=1       one or two rows per suite
#   ATTNC_PYTEST_ARGS   extra pytest arguments
#   ATTNC_BENCH_ARGS    extra benchmark arguments (e.g. "--skip flashinfer_fa3 --only 8192")
#   ATTNC_BUDGET        seconds after which the benchmarks start no new row (default: none)
set -o pipefail

OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
status=0

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "wheel install failed"; status=1; }
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1

nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if [ "${ATTNC_SKIP_TESTS:-0}" != "1" ]; then
    # shellcheck disable=SC2086
    python3 -m pytest -m gpu tests/gpu -q ${ATTNC_PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log"
    rc=$?
    # pytest exit 5: no tests collected
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        echo "GPU tests failed (exit $rc); running the benchmarks anyway"
        status=1
    fi
fi

# shellcheck disable=SC2206
bench_args=(--suite ${ATTNC_SUITES:-prefill} --out "$OUT")
if [ "${ATTNC_QUICK:-0}" = "1" ]; then
    bench_args+=(--quick)
fi
if [ -n "${ATTNC_BUDGET:-}" ]; then
    bench_args+=(--budget "$ATTNC_BUDGET")
fi
# shellcheck disable=SC2206
bench_args+=(${ATTNC_BENCH_ARGS:-})
python3 -m benchmarks "${bench_args[@]}" > "$OUT/bench.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "benchmarks failed (exit $rc); last lines of bench.log:"
    tail -n 30 "$OUT/bench.log"
    status=1
fi

echo
if [ -f "$OUT/bench.md" ]; then
    cat "$OUT/bench.md"
else
    echo "no bench.md written"
fi
exit "$status"
