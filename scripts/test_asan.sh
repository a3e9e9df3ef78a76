#!/usr/bin/env bash
# Runs the CPU test binary built with AddressSanitizer + UBSan (make
# test-asan) and fails on any report. Criterion decides pass/fail inside
# each forked test worker, before LeakSanitizer's check at the worker's
# exit, so a leak would not fail the test itself: the log is searched too.
set -uo pipefail
bin=${1:?usage: scripts/test_asan.sh build/asan/mt_tests}
log=$(dirname "$bin")/test.log
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$(dirname "$0")/lsan.supp:print_suppressions=0
"$bin" --jobs 2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
    echo "test-asan: sanitizer reports in $log:" >&2
    grep -E -A8 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log" | head -60 >&2
    exit 1
fi
exit "$status"
