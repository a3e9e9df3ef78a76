#!/usr/bin/env bash
# Soak test of interrupted training: the built-in model trains on the CPU
# while SIGTERM (clean stop with a checkpoint) and SIGKILL (no warning)
# arrive at random times, and each time the run resumes with --resume auto.
# Each cycle's losses and final weights must equal, bitwise, those of one
# uninterrupted run. Repeats cycles until MINUTES have passed.
#
#   scripts/soak.sh [MINUTES] [STEPS]      (defaults 10 and 300)
#
# Prints one line per cycle and a summary; exits 1 at the first mismatch,
# leaving its directory for inspection.
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
steps=${2:-300}
bin=build/megatrain
[ -x "$bin" ] || { echo "soak: build first (make build)" >&2; exit 2; }
work=$(mktemp -d /tmp/megatrain-soak-XXXXXX)
opts=(--device cpu --steps "$steps" --save-every 1 --keep-last 2 --sample-tokens 0
      --save-dtype fp32 --log-every 100000)

losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl"; }

"$bin" train --out "$work/ref" "${opts[@]}" >/dev/null || { echo "soak: reference run failed" >&2; exit 1; }
losses "$work/ref" >"$work/ref.losses"

end=$(( $(date +%s) + minutes * 60 ))
cycles=0 terms=0 kills=0 resumes=0
while [ "$(date +%s)" -lt "$end" ]; do
    out="$work/run$cycles"
    while :; do
        "$bin" train --out "$out" "${opts[@]}" --resume auto >>"$work/run$cycles.log" 2>&1 &
        pid=$!
        # 0.05 to 2.5 s: some land in a save, some in a step, some at start
        sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.05 + 2.45 * r / 32767 }')"
        if kill -0 "$pid" 2>/dev/null; then
            if [ $((RANDOM % 2)) -eq 0 ]; then kill -TERM "$pid"; terms=$((terms + 1));
            else kill -KILL "$pid"; kills=$((kills + 1)); fi
        fi
        wait "$pid"
        status=$?
        resumes=$((resumes + 1))
        [ "$status" -eq 0 ] && [ -f "$out/model/model.safetensors" ] && break
        case $status in 130|137|143) ;; # SIGTERM honoured, SIGKILL, or killed before the handler
            *) echo "soak: cycle $cycles: unexpected exit status $status (see $work/run$cycles.log)" >&2
               exit 1 ;;
        esac
    done
    if ! losses "$out" | cmp -s - "$work/ref.losses"; then
        echo "soak: cycle $cycles: losses differ from the uninterrupted run ($out)" >&2; exit 1
    fi
    if ! cmp -s "$out/model/model.safetensors" "$work/ref/model/model.safetensors"; then
        echo "soak: cycle $cycles: final weights differ ($out)" >&2; exit 1
    fi
    n=$(ls -d "$out"/checkpoints/step-* | wc -l)
    tmp=$(ls -d "$out"/checkpoints/.tmp-* 2>/dev/null | wc -l)
    echo "cycle $cycles: $steps steps bitwise equal; checkpoints left $n, temporary $tmp"
    [ "$n" -le 2 ] && [ "$tmp" -eq 0 ] || { echo "soak: keep_last 2 not held" >&2; exit 1; }
    rm -rf "$out"
    cycles=$((cycles + 1))
done
echo "soak: $cycles cycles of $steps steps in $minutes min: $terms SIGTERM, $kills SIGKILL," \
     "$((resumes - cycles)) interruptions resumed; every cycle bitwise equal to the uninterrupted run"
rm -rf "$work"
