#!/usr/bin/env bash
# The GPU test tier on the GPU machine, as fast as its module builds allow: with pytest-xdist
# installed, the test files run on ATTNC_TEST_WORKERS worker processes (default 6; 0 = one
# process), each file whole on one worker (--dist loadfile), so that the nvcc builds of
# different files overlap (the JIT cache's file locks keep one build per module). The files in
# SERIAL_TESTS run afterwards in one process: they time plan() against a busy GPU, or give a
# child process a deadline, which other tests sharing the GPU and the host would upset.
# Every test's outcome is printed as it ends (-v), so a run stopped by a time limit still
# shows which tests passed. Extra arguments go to every pytest call. Exit status: the first failing pytest's, where
# 5 (no tests collected) counts as success.
set -u
SERIAL_TESTS=(tests/gpu/test_decode_plan_host.py tests/gpu/test_prefill_repeat.py)
workers="${ATTNC_TEST_WORKERS:-6}"
case "$workers" in
    *[!0-9]*)
        printf 'ATTNC_TEST_WORKERS must be a whole number (0 = one process), got %q\n' \
            "$workers" >&2
        exit 2 ;;
esac

status=0
note() {  # keep the first failure's exit status
    local rc=$1
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

if [ "$workers" -gt 0 ] && python3 -c "import xdist" 2> /dev/null; then
    ignore=()
    for f in "${SERIAL_TESTS[@]}"; do ignore+=(--ignore "$f"); done
    python3 -m pytest -m gpu tests/gpu -v -rf -n "$workers" --dist loadfile "${ignore[@]}" "$@"
    note $?
    python3 -m pytest -m gpu -v -rf "${SERIAL_TESTS[@]}" "$@"
    note $?
else
    python3 -m pytest -m gpu tests/gpu -v -rf "$@"
    note $?
fi
exit "$status"
