#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ (clang, ASan + UBSan) and
# runs each for FUZZ_SECONDS, starting from the committed seed corpus in
# tests/fuzz/corpus/<harness>/ (copied: new inputs stay in build/fuzz/).
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]      (make fuzz FUZZ_SECONDS=N)
#
# Prints per harness: seconds, executions, executions/s, coverage (edges),
# corpus size, crashes. A crash leaves its input in build/fuzz/crashes/;
# turn it into a regression input under tests/fuzz/regressions/<harness>/
# (make test replays those). Exits 1 if any harness crashed.
#
# Two runs may go on at once with different harness lists (one per core):
# the library build is serialised by a lock, and each harness has its own
# binary, corpus, log and crash prefix under build/fuzz/.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
mkdir -p build/fuzz
flock build/fuzz/.lock make --no-print-directory -j2 BUILD=build/fuzz/lib CC=clang NVCC= \
    EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $san" \
    build/fuzz/lib/libmegatrain.a >/dev/null || exit 2
libs="-fopenmp -lcjson -lpcre2-8 -lutf8proc -lyaml -lxxhash -lz -lzstd -lprotobuf-c -lisal -lm -lpthread"
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(ls tests/fuzz/fuzz_*.c | sed 's|tests/fuzz/fuzz_||; s|\.c$||'))
mkdir -p build/fuzz/crashes  # crashes of earlier runs count again until removed
printf '%-15s %6s %10s %8s %6s %6s %7s\n' harness seconds execs execs/s cov corpus crashes
failed=0
for n in "${names[@]}"; do
    bin=build/fuzz/fuzz_$n
    clang -std=c11 -O1 -g -D_GNU_SOURCE -Iinclude -Isrc -Itests/fuzz -fsanitize=fuzzer $san \
        "tests/fuzz/fuzz_$n.c" build/fuzz/lib/libmegatrain.a \
        $libs -o "$bin" || exit 2
    corpus=build/fuzz/corpus/$n
    mkdir -p "$corpus"
    [ -d "tests/fuzz/corpus/$n" ] && cp -n tests/fuzz/corpus/$n/* "$corpus"/ 2>/dev/null
    log=build/fuzz/$n.log
    t0=$(date +%s)
    nice -n 19 "$bin" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -artifact_prefix="build/fuzz/crashes/$n-" "$corpus" >"$log" 2>&1
    status=$?
    t1=$(date +%s)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    corp=$(ls "$corpus" | wc -l)
    # a slow unit (libFuzzer's slow-unit-*) is kept beside them but is no failure
    crashes=$(ls build/fuzz/crashes/ 2>/dev/null | grep -cE "^$n-(crash|leak|timeout|oom)-")
    [ "$status" -ne 0 ] && failed=1
    printf '%-15s %6s %10s %8s %6s %6s %7s\n' "$n" $((t1 - t0)) "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "$corp" "$crashes"
done
exit $failed
