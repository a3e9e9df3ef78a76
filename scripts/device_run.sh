#!/usr/bin/env bash
# On a GPU machine: the GPU tests, then the benchmarks; logs go to $OUT (default below).
# BUILD names the build folder (default build).
# Usage: scripts/device_run.sh [bench arguments for 'megatrain bench train' ...]
set -uo pipefail
OUT=${OUT:-/tmp/megatrain-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build}; export BUILD
export LD_LIBRARY_PATH=$PWD/$BUILD/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc; free -g | head -2
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout 300 make test-gpu 2>&1 | tee "$OUT/test-gpu.log" | grep -E "FAIL|Synthesis|rel err|Assert|error" | head -40
fi
if [ "${SKIP_ADAMW:-0}" != 1 ]; then
    OMP_PROC_BIND=close OMP_PLACES=cores timeout 60 $BUILD/megatrain bench adamw --params 200000000 2>&1 | tee "$OUT/adamw.log"
fi
i=0
for args in "$@"; do
    i=$((i + 1))
    echo "== bench train $args"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-300}" $BUILD/megatrain bench train $args 2>&1 | tee "$OUT/bench$i.log" | tail -12
done
