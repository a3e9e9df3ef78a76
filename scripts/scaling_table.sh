#!/usr/bin/env bash
# The projection table of docs/scaling.md: megatrain plan for each shape on
# one H200 (139 GB for the run) with hosts of several sizes, at the rates
# measured on the H200 (mt_rates_default, bench/RESULTS.md). Usage: scripts/scaling_table.sh [plan options, e.g. --micro-batches 1]
set -uo pipefail
bin=${MEGATRAIN:-build/megatrain}
echo "| model | host | fits | host GB | host B/param | host grads | kept layers | step s | model TFLOPS |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for p in 13b 34b 70b 123b 405b; do
    for h in 256 512 1000 1500 2000; do
        hb=$(awk -v h="$h" 'BEGIN { m = 0.04 * h; if (m < 4) m = 4; print h - m }')
        out=$("$bin" plan --preset "$p" --gpu-mem 139 --host-mem "$hb" "$@" 2>&1)
        line=$(grep '^PLAN' <<< "$out")
        if [ -z "$line" ]; then
            need=$(grep -o 'host needs [0-9.]* GB' <<< "$out" | head -1)
            echo "| $p | $h GB | no | ${need#host needs } needed | | | | | |"
            continue
        fi
        get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$line"; }
        echo "| $p | $h GB | yes | $(get host_GB) | $(get host_bytes_per_param) | $(get host_grads) | $(get kept) | $(get step_s) | $(get TFLOPS) |"
    done
done
