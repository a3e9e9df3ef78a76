#!/usr/bin/env bash
# On a machine with several GPUs: the multi-GPU tests, then `bench train`
# of one preset on 1, 2, ... GPUs of this machine in one call, and a table
# of tokens/s and the speed-up over one GPU. Logs go to $OUT.
# BUILD names the build folder (default build); NCCL comes from
# MT_NCCL_LIBRARY, else the loader's search, else PyTorch's wheel.
# Usage: scripts/device_multi.sh PRESET "GPU COUNTS" [bench train arguments...]
#   e.g. scripts/device_multi.sh 8b "1 2" --micro-batches 4 --batch-size 8 --host-mem 240
set -uo pipefail
OUT=${OUT:-/tmp/megatrain-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build}; export BUILD
export LD_LIBRARY_PATH=$PWD/$BUILD/lib:${LD_LIBRARY_PATH:-}
if [ -z "${MT_NCCL_LIBRARY:-}" ] && ! ldconfig -p | grep -q libnccl.so.2; then
    MT_NCCL_LIBRARY=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    export MT_NCCL_LIBRARY
fi
echo "NCCL: ${MT_NCCL_LIBRARY:-system}"
preset=$1 counts=$2
shift 2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
nproc; free -g | head -2
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout 600 tests/gpu/multi_gpu.sh 2>&1 | tee "$OUT/multi_gpu.log" | tail -12
fi
for g in $counts; do
    echo "== bench train --preset $preset --gpus $g $*"
    timeout "${BENCH_TIMEOUT:-400}" $BUILD/megatrain bench train --preset "$preset" --gpus "$g" "$@" \
        2>&1 | tee "$OUT/bench-$preset-$g.log" | tail -6
done
echo
echo "| GPUs | tok/s | speed-up | model TFLOPS per GPU | step s | host RSS GB (all ranks) |"
echo "| --- | --- | --- | --- | --- | --- |"
base=
for g in $counts; do
    line=$(grep '^RESULT' "$OUT/bench-$preset-$g.log" | tail -1)
    [ -n "$line" ] || { echo "| $g | (failed) | | | | |"; continue; }
    tps=$(sed -n 's/.* tok\/s=\([0-9.]*\).*/\1/p' <<<"$line")
    tf=$(sed -n 's/.* TFLOPS=\([0-9.]*\).*/\1/p' <<<"$line")
    st=$(sed -n 's/.* step_s=\([0-9.]*\).*/\1/p' <<<"$line")
    rss=$(sed -n 's/.* host_rss_GB=\([0-9.]*\).*/\1/p' <<<"$line")
    base=${base:-$tps}
    echo "| $g | $tps | $(python3 -c "print(f'{$tps / $base:.2f}x')") | $tf | $st | $rss |"
done
