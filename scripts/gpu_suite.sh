#!/usr/bin/env bash
# One call on the GPU machine: install carried wheels, run the GPU tests, run every benchmark
# suite with the fast profile, print the markdown tables last.
#
# The GPU call has a hard limit of 10 minutes. The script keeps to ATTNC_TIME_LIMIT seconds
# (default 570 = 9.5 min) in all: the tests get at most ATTNC_TEST_LIMIT seconds, the
# benchmarks get what is left (as --budget, split over the suites, minus a margin for a row
# that overruns) and are stopped with SIGTERM at the end of it (they then still write
# bench.json, bench.md and the plots, and print the tables).
#
# Environment:
#   OUT                 output folder (default ./gpu_out); logs and results go here
#   ATTNC_SKIP_TESTS=1  skip the pytest GPU tests
#   ATTNC_SUITES        benchmark suites (default: all = "prefill decode host batch jit")
#   ATTNC_QUICK=1       one or two rows per suite; ATTNC_FULL=1: every row, longer timing
#   ATTNC_PYTEST_ARGS   extra pytest arguments
#   ATTNC_BENCH_ARGS    extra benchmark arguments, split at spaces (e.g. "--fa3 --skip flex")
#   ATTNC_ONLY          rows to keep, passed whole as --only (e.g. "D=|GQA|page 1")
#   ATTNC_BUDGET        seconds for the benchmarks (default: time left before the limit)
#   ATTNC_TIME_LIMIT    seconds for the whole script (default 570)
#   ATTNC_TEST_LIMIT    seconds at most for the GPU tests (default 330)
set -o pipefail

START=$(date +%s)
LIMIT="${ATTNC_TIME_LIMIT:-570}"
elapsed() { echo $(( $(date +%s) - START )); }

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
    test_limit="${ATTNC_TEST_LIMIT:-330}"
    # shellcheck disable=SC2086
    timeout -s TERM -k 10 "$test_limit" python3 -m pytest -m gpu tests/gpu -q \
        ${ATTNC_PYTEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1
    rc=$?
    tail -n 15 "$OUT/gpu_tests.log"
    # pytest exit 5: no tests collected; 124/137: stopped by the time limit
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "GPU tests stopped after ${test_limit} s (ATTNC_TEST_LIMIT); running the benchmarks"
        status=1
    elif [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        echo "GPU tests failed (exit $rc); running the benchmarks anyway"
        status=1
    fi
    echo "tests took $(elapsed) s"
fi

# Time left for the benchmarks: the limit minus what was used, minus 15 s to print and exit.
left=$(( LIMIT - $(elapsed) - 15 ))
if [ "$left" -lt 30 ]; then
    echo "only ${left} s left: benchmarks not run"
    exit 1
fi
# Rows start only inside the budget; 30 s of margin for a row that overruns it.
budget="${ATTNC_BUDGET:-$(( left > 90 ? left - 30 : left * 2 / 3 ))}"

# shellcheck disable=SC2206
bench_args=(--suite ${ATTNC_SUITES:-all} --out "$OUT" --budget "$budget")
if [ "${ATTNC_QUICK:-0}" = "1" ]; then
    bench_args+=(--quick)
elif [ "${ATTNC_FULL:-0}" = "1" ]; then
    bench_args+=(--full)
fi
# shellcheck disable=SC2206
bench_args+=(${ATTNC_BENCH_ARGS:-})
if [ -n "${ATTNC_ONLY:-}" ]; then
    bench_args+=(--only "$ATTNC_ONLY")
fi
echo "benchmarks: ${bench_args[*]} (stopped after ${left} s)"
timeout -s TERM -k 15 "$left" python3 -m benchmarks "${bench_args[@]}" > "$OUT/bench.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "benchmarks failed (exit $rc); last lines of bench.log:"
    tail -n 30 "$OUT/bench.log"
    status=1
fi
echo "total $(elapsed) s"

echo
if [ -f "$OUT/bench.md" ]; then
    cat "$OUT/bench.md"
else
    echo "no bench.md written"
fi
exit "$status"
