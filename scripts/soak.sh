#!/usr/bin/env bash
# Soak test of interrupted training: the built-in model trains on the CPU
# while it is interrupted at random, and each time the run resumes with
# --resume auto. Each cycle's losses and final weights must equal, bitwise,
# those of one uninterrupted run. Repeats cycles until MINUTES have passed.
#
#   scripts/soak.sh [MINUTES] [STEPS]      (defaults 10 and 300)
#
# MEGATRAIN names the binary (default build/megatrain).
#
# Two cycles of short steps (STEPS of them) for one of long steps (6 steps of
# about a second or more). The interruptions of a short cycle, one at a time:
#   - SIGTERM (a clean stop with a checkpoint) or SIGKILL (no warning),
#     0.05 to 2.5 s after a start: in a step, a save, or the start;
#   - a second run started on the same --out while the first runs: it must
#     be refused naming the first ("is in use by"), and change nothing; the
#     first is then stopped by SIGTERM or SIGKILL as above;
#   - the disk filling up while the run writes (metrics rows, TensorBoard
#     events, checkpoints): the out directory lies on a small tmpfs that a
#     file fills to the last byte at a random moment; the run must stop with
#     "No space left on device", and resume once the file is gone. This needs
#     a mount namespace (unshare -rm, which the script re-runs itself in);
#     without one it is left out, and said.
# A long cycle gets SIGTERM in the middle of a step: the step is abandoned
# at its next layer, so the run must be gone within half a step (plus a
# second for the checkpoint and the exit), not after the step.
#
# Prints one line per cycle and a summary; exits 1 at the first mismatch,
# leaving its directory for inspection.
set -uo pipefail
if [ -z "${MT_SOAK_IN_NS:-}" ] && unshare -rm true 2>/dev/null; then
    MT_SOAK_IN_NS=1 exec unshare -rm "$0" "$@"
fi
cd "$(dirname "$0")/.."
minutes=${1:-10}
steps=${2:-300}
bin=${MEGATRAIN:-build/megatrain}
[ -x "$bin" ] || { echo "soak: build first (make build)" >&2; exit 2; }
work=$(mktemp -d /tmp/megatrain-soak-XXXXXX)
disk=""
if [ -n "${MT_SOAK_IN_NS:-}" ]; then
    mkdir "$work/disk"
    mount -t tmpfs -o size=24m soak "$work/disk" && disk=$work/disk
fi
[ -n "$disk" ] || echo "soak: no mount namespace here: the full disk is left out" >&2
base=(--device cpu --save-every 1 --keep-last 2 --sample-tokens 0 --save-dtype fp32
      --log-every 100000)
short=("${base[@]}" --steps "$steps")
long=("${base[@]}" --steps 6 --seq-len 512 --batch-size 4 --micro-batches 4)

losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl"; }
now() { date +%s.%N; }
rand() { awk -v r=$RANDOM -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a + (b - a) * r / 32767 }'; }

"$bin" train --out "$work/ref" "${short[@]}" >/dev/null || { echo "soak: reference run failed" >&2; exit 1; }
losses "$work/ref" >"$work/ref.losses"
"$bin" train --out "$work/ref_long" "${long[@]}" >/dev/null ||
    { echo "soak: reference run (long steps) failed" >&2; exit 1; }
losses "$work/ref_long" >"$work/ref_long.losses"
# the median and the longest step of the reference
times=$(grep -o '"step_time_s":[^,}]*' "$work/ref_long/metrics.jsonl" | cut -d: -f2 | sort -g)
step_s=$(echo "$times" | tail -1)
median_s=$(echo "$times" | awk '{ t[NR] = $1 } END { print t[int((NR + 1) / 2)] }')
echo "soak: long steps take ${median_s} s (up to ${step_s} s)"

end=$(( $(date +%s) + minutes * 60 ))
cycles=0 terms=0 kills=0 resumes=0 second=0 refused=0 fulls=0 long_stops=0 slowest=0
while [ "$(date +%s)" -lt "$end" ]; do
    kind=short opts=("${short[@]}") ref=$work/ref
    if [ $((cycles % 3)) -eq 2 ]; then kind=long opts=("${long[@]}") ref=$work/ref_long; fi
    out="${disk:-$work}/run$cycles"
    log=$work/run$cycles.log
    while :; do
        what=signal
        if [ "$kind" = short ]; then
            r=$((RANDOM % 4))
            [ "$r" -eq 2 ] && what=second
            [ "$r" -eq 3 ] && [ -n "$disk" ] && what=full
        fi
        "$bin" train --out "$out" "${opts[@]}" --resume auto >"$work/try.log" 2>&1 &
        pid=$!
        t_term=""
        if [ "$kind" = long ]; then
            # past the start (about a second) into the first or second step
            sleep "$(rand 1.0 "$(awk -v s="$median_s" 'BEGIN { print 1.0 + 1.5 * s }')")"
            if kill -0 "$pid" 2>/dev/null; then
                t_term=$(now); kill -TERM "$pid"; terms=$((terms + 1))
            fi
        elif [ "$what" = full ]; then
            sleep "$(rand 0.05 2.5)"
            # the disk fills to its last byte, then stays full until the run ends
            dd if=/dev/zero of="$disk/fill" bs=64k 2>/dev/null
            fulls=$((fulls + 1))
        else
            if [ "$what" = second ]; then
                sleep "$(rand 0.1 1.0)"
                second=$((second + 1))
                "$bin" train --out "$out" "${opts[@]}" --resume auto >"$work/second.log" 2>&1
                st2=$?
                if [ "$st2" -eq 1 ] && grep -q "is in use by" "$work/second.log"; then
                    refused=$((refused + 1))
                elif kill -0 "$pid" 2>/dev/null; then
                    echo "soak: cycle $cycles: a second run on a busy --out exited $st2:" >&2
                    cat "$work/second.log" >&2; exit 1
                fi # else the first had ended already: the second ran alone, a resume
                cat "$work/second.log" >>"$log"
            fi
            sleep "$(rand 0.05 2.5)"
            if kill -0 "$pid" 2>/dev/null; then
                if [ $((RANDOM % 2)) -eq 0 ]; then kill -TERM "$pid"; terms=$((terms + 1));
                else kill -KILL "$pid"; kills=$((kills + 1)); fi
            fi
        fi
        wait "$pid" 2>/dev/null # (bash says "Killed" of a SIGKILL otherwise)
        status=$?
        cat "$work/try.log" >>"$log"
        echo "$kind $what $status" >>"$work/attempts"
        if [ -n "$t_term" ] && [ "$status" -eq 130 ]; then
            took=$(awk -v a="$t_term" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
            long_stops=$((long_stops + 1))
            slowest=$(awk -v a="$slowest" -v b="$took" 'BEGIN { print (b > a ? b : a) }')
            if awk -v t="$took" -v s="$step_s" 'BEGIN { exit !(t > s / 2 + 1) }'; then
                echo "soak: cycle $cycles: SIGTERM in a step of ${step_s} s took ${took} s to" \
                     "stop (see $log)" >&2
                exit 1
            fi
        fi
        [ "$what" = full ] && rm -f "$disk/fill"
        resumes=$((resumes + 1))
        [ "$status" -eq 0 ] && [ -f "$out/model/model.safetensors" ] && break
        case $status in
            130|137|143) ;; # SIGTERM honoured, SIGKILL, or killed before the handler
            1) # a full disk says so; a run that a second one beat to the lock names it
               if ! { [ "$what" = full ] && grep -q "No space left on device" "$work/try.log"; } &&
                  ! { [ "$what" = second ] && grep -q "is in use by" "$work/try.log"; }; then
                   echo "soak: cycle $cycles: the run failed (see $log)" >&2; exit 1
               fi ;;
            *) echo "soak: cycle $cycles: unexpected exit status $status (see $log)" >&2
               exit 1 ;;
        esac
    done
    if ! losses "$out" | cmp -s - "$ref.losses"; then
        echo "soak: cycle $cycles: losses differ from the uninterrupted run ($out)" >&2; exit 1
    fi
    if ! cmp -s "$out/model/model.safetensors" "$ref/model/model.safetensors"; then
        echo "soak: cycle $cycles: final weights differ ($out)" >&2; exit 1
    fi
    n=$(ls -d "$out"/checkpoints/step-* | wc -l)
    tmp=$(ls -d "$out"/checkpoints/.tmp-* 2>/dev/null | wc -l)
    echo "cycle $cycles ($kind steps): bitwise equal; checkpoints left $n, temporary $tmp"
    [ "$n" -le 2 ] && [ "$tmp" -eq 0 ] || { echo "soak: keep_last 2 not held" >&2; exit 1; }
    rm -rf "$out" "$log"
    cycles=$((cycles + 1))
done
echo "soak: attempts by cycle kind, interruption and exit status:"
sort "$work/attempts" | uniq -c | sed 's/^/  /'
echo "soak: $cycles cycles in $minutes min: $terms SIGTERM ($long_stops in a long step, the" \
     "slowest stop ${slowest} s for steps of ${median_s} s, up to ${step_s} s), $kills SIGKILL, $second second runs" \
     "($refused refused), $fulls full disks; $((resumes - cycles)) interruptions resumed;" \
     "every cycle bitwise equal to the uninterrupted run"
[ -n "$disk" ] && umount "$disk"
rm -rf "$work"
