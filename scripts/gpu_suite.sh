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
#   ATTNC_TEST_WORKERS  worker processes for the GPU tests (scripts/gpu_tests.sh) when
#                       pytest-xdist is installed (carry its wheel and execnet's in .whl;
#                       default 6, 0 = one process)
#   ATTNC_BENCH_ARGS    extra benchmark arguments, split at spaces (e.g. "--no-fa3 --skip flex")
#   ATTNC_ONLY          rows to keep, passed whole as --only (e.g. "D=|GQA|page 1")
#   ATTNC_BUDGET        seconds for the benchmarks (default: time left before the limit)
#   ATTNC_TIME_LIMIT    seconds for the whole script (default 570)
#   ATTNC_TEST_LIMIT    seconds at most for the GPU tests (default 330)
#   ATTNC_FA4_SITE      folder holding flash-attn-4 and the CuTe DSL (default /tmp/fa4site)
#
# FA4 and FlexAttention's FLASH backend (shared/tools/fa4_wheels.sh DIR makes DIR_a, DIR_b;
# carry them as .fa4_a and .fa4_b): a call that carries .fa4_a keeps its part in /tmp/keep; a
# later call on the same warm machine that carries .fa4_b joins the parts and installs all
# wheels into ATTNC_FA4_SITE. When that folder holds FA4, its paths go into
# ATTNC_FA4_PYTHONPATH, which only the benchmarks' anchor child puts on its PYTHONPATH: FA4
# needs apache-tvm-ffi 0.1.11, FlashInfer 0.5.3 (in /tmp/site) needs 0.1.6, so the two never
# share a process, and the GPU tests do not see FA4 at all.
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
    timeout -s TERM -k 10 "$test_limit" bash scripts/gpu_tests.sh ${ATTNC_PYTEST_ARGS:-} \
        > "$OUT/gpu_tests.log" 2>&1
    rc=$?
    tail -n 15 "$OUT/gpu_tests.log"
    echo "outcomes per test file (from the log, also when the time limit stopped the run):"
    grep -oE "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) tests/gpu/[A-Za-z0-9_/]+\.py" \
        "$OUT/gpu_tests.log" | sort | uniq -c
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

FA4_SITE="${ATTNC_FA4_SITE:-/tmp/fa4site}"
FA4_BIG_WHEEL=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [ -f .fa4_a/part_aa ]; then
    mkdir -p /tmp/keep && cp .fa4_a/* /tmp/keep/ && echo "FA4: first part kept in /tmp/keep"
fi
if [ ! -d "$FA4_SITE/flash_attn/cute" ] && [ -f /tmp/keep/part_aa ] && [ -f .fa4_b/part_ab ]; then
    echo "FA4: installing into $FA4_SITE"
    { cat /tmp/keep/part_aa .fa4_b/part_ab > "/tmp/keep/$FA4_BIG_WHEEL" &&
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$FA4_SITE" \
          /tmp/keep/*.whl .fa4_b/*.whl; } || echo "FA4 install failed (FA4 anchors show missing)"
fi
if [ ! -d "$FA4_SITE/flash_attn/cute" ] && [ -f .fa4_b/part_ab ] && [ ! -f /tmp/keep/part_aa ]; then
    echo "FA4: .fa4_b carried but /tmp/keep/part_aa is missing (carry .fa4_a in an earlier call)"
fi
if [ -d "$FA4_SITE/flash_attn/cute" ]; then
    fa4_path="$FA4_SITE"
    # --target does not run the packages' .pth files: add the folders they name.
    for pth in "$FA4_SITE"/*.pth; do
        [ -f "$pth" ] || continue
        while IFS= read -r line; do
            case "$line" in ""|"#"*|import*) continue ;; esac
            if [ -d "$FA4_SITE/$line" ]; then fa4_path="$fa4_path:$FA4_SITE/$line"; fi
        done < "$pth"
    done
    dsl="$FA4_SITE/nvidia_cutlass_dsl/dsl_packages"
    case ":$fa4_path:" in *":$dsl:"*) ;; *) [ -d "$dsl" ] && fa4_path="$fa4_path:$dsl" ;; esac
    export ATTNC_FA4_PYTHONPATH="$fa4_path"
    echo "FA4 anchors: ATTNC_FA4_PYTHONPATH=$ATTNC_FA4_PYTHONPATH"
else
    echo "FA4 anchors: no flash-attn-4 in $FA4_SITE (fa4 and flex_flash show as missing)"
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
