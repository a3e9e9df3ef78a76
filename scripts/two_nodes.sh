#!/usr/bin/env bash
# Two "machines" on one server of 4 GPUs, for measuring a run across
# machines without a second server: ranks 0-1 on GPUs 0-1 and ranks 2-3 on
# GPUs 2-3 (LOCAL_WORLD_SIZE=2: each pair shares its "machine's" --host-mem),
# NCCL kept off NVLink and shared memory (sockets on the loopback stand in
# for the network), each rank bound to its own quarter of the cores as a
# launcher would. Runs `megatrain ARGS...` as the 4 ranks, e.g.
#   scripts/two_nodes.sh bench train --preset 34b --host-mem 250 --micro-batches 1
# Rank 0 writes to stdout, rank r to $OUT/rank-r.log. Exits non-zero if a rank failed.
set -uo pipefail
OUT=${OUT:-/tmp/megatrain-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build}
bin=$BUILD/megatrain
export LD_LIBRARY_PATH=$PWD/$BUILD/lib:${LD_LIBRARY_PATH:-}
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517} WORLD_SIZE=4 LOCAL_WORLD_SIZE=2
export MT_DIST_TIMEOUT=${MT_DIST_TIMEOUT:-120}
cores=$(nproc)
per=$((cores / 4))
pids=()
for r in 0 1 2 3; do
    node=$((r / 2)) local=$((r % 2))
    log=$OUT/rank-$r.log
    [ $r = 0 ] && log=/dev/stdout
    CUDA_VISIBLE_DEVICES=$((2 * node)),$((2 * node + 1)) RANK=$r LOCAL_RANK=$local \
        taskset -c $((r * per))-$((r * per + per - 1)) "$bin" "$@" >"$log" 2>&1 &
    pids+=($!)
done
rc=0
for r in 0 1 2 3; do
    wait "${pids[$r]}" || { echo "rank $r failed (status $?): see $OUT/rank-$r.log"; rc=1; }
done
exit $rc
