#!/usr/bin/env bash
# The disk tier on the GPU: a run whose last layers keep their Adam m and v
# on disk (--nvme-dir) gives the bits of the run with everything in RAM
# (same arithmetic, only where the state waits), checkpoints included; a
# resume of it continues with the uninterrupted run's losses; so do runs
# whose last layers keep their fp32 weights on disk too (a bf16 copy in
# RAM, --disk-weight-layers); a run whose
# saved layer inputs (some of them) wait on disk gives the bits of the run
# with them in RAM (fp32 and bf16 saved inputs); and `bench train` with
# disk layers or disk-saved inputs ends on the loss of the same bench
# without them.
# Run by `make test-gpu` (the directory: MT_TEST_NVME_DIR, else a temporary
# one under /tmp). Prints "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${BUILD:-build}/megatrain
tmp=$(mktemp -d)
disk=${MT_TEST_NVME_DIR:-$tmp}
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $*"; fi; }

python3 - "$tmp" <<'PY'
import json, random, sys
random.seed(5)
words = "the a river boat old man woman walked saw near by city morning night red green".split()
with open(f"{sys.argv[1]}/train.jsonl", "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(60))}) + "\n")
PY
$bin init --tokenizer tests/fixtures/tokenizer/tiny_bytelevel.json --out "$tmp/init" \
    --hidden 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 --max-pos 128 >/dev/null

# train OUT STEPS [extra...]: bf16, 4 micro-batches of 4 x 64 tokens
train() {
    local out=$1 steps=$2
    shift 2
    $bin train --model "$tmp/init" --data "$tmp/train.jsonl" --out "$out" --seq-len 64 \
        --batch-size 4 --micro-batches 4 --steps "$steps" --lr 1e-3 --warmup-steps 2 \
        --save-every 4 --save-dtype fp32 "$@" >"$out.log" 2>&1 ||
        { echo "train $out failed:"; tail -5 "$out.log"; return 1; }
}

# bitwise A B: every step's loss and gradient norm printed alike (%.9g: a float's bits)
bitwise() {
    python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def rows(p):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print(f"  {sys.argv[2].split('/')[-2]}: {len(b)} steps, {'the same bits' if a == b else 'DIFFERENT'}")
sys.exit(0 if a == b and a else 1)
PY
}

train "$tmp/ram" 8 && train "$tmp/disk" 8 --nvme-dir "$disk" --disk-layers 3 &&
    grep -q "disk tier: the optimizer state of the last 3 layers" "$tmp/disk.log" ||
    { fail=$((fail + 1)); echo "FAILED: the runs"; }
check bitwise "$tmp/ram" "$tmp/disk"
check cmp "$tmp/ram/model/model.safetensors" "$tmp/disk/model/model.safetensors"
# resume the disk run from its step-4 checkpoint: the state comes back from the checkpoint
rm -rf "$tmp/disk/checkpoints/step-00000008" "$tmp/disk/model"
check train "$tmp/disk" 8 --nvme-dir "$disk" --disk-layers 3 --resume auto
check bitwise "$tmp/ram" "$tmp/disk"

# the fp32 weights of the last layers on disk too, RAM keeping a bf16 copy of them for the
# GPU: the same bits as the run in RAM (the copy is the round to nearest even the GPU's own
# cast gives, and the norms stay fp32), the saved model (its fp32 masters read from the
# disk) included; the weights of the last 2 layers (the head and the last block) and of the
# last 1; then a resume of the first from its step-4 checkpoint (the weights come back to
# the disk from it); an fp32 run is refused by name
for nw in 2 1; do
    train "$tmp/wdisk-$nw" 8 --nvme-dir "$disk" --disk-layers 3 --disk-weight-layers $nw &&
        grep -q "disk tier: the fp32 weights of the last $nw layers too" "$tmp/wdisk-$nw.log" ||
        { fail=$((fail + 1)); echo "FAILED: the run with the weights of $nw layers on disk"; }
    check bitwise "$tmp/ram" "$tmp/wdisk-$nw"
    check cmp "$tmp/ram/model/model.safetensors" "$tmp/wdisk-$nw/model/model.safetensors"
done
rm -rf "$tmp/wdisk-2/checkpoints/step-00000008" "$tmp/wdisk-2/model"
check train "$tmp/wdisk-2" 8 --nvme-dir "$disk" --disk-layers 3 --disk-weight-layers 2 \
    --resume auto
check bitwise "$tmp/ram" "$tmp/wdisk-2"
check cmp "$tmp/ram/model/model.safetensors" "$tmp/wdisk-2/model/model.safetensors"
! train "$tmp/wdisk-fp32" 2 --precision fp32 --nvme-dir "$disk" --disk-weight-layers 1 \
    >/dev/null 2>&1
check grep -q -- "--disk-weight-layers 1: .*an fp32 run cannot" "$tmp/wdisk-fp32.log"

# saved layer inputs on disk: written in the forward, read back in the backward, the same
# bits as in RAM. Without the planner (--host-saved-inputs: every saved input on the host)
# the two runs' homes differ in the disk alone, fp32 and bf16 saved inputs alike; with it,
# forced onto 2 layers, the planner run in RAM's bits (its saved inputs fp32 either way)
for dt in fp32 bf16; do
    train "$tmp/hs-$dt" 6 --host-saved-inputs --saved-input-dtype $dt &&
        train "$tmp/hsd-$dt" 6 --host-saved-inputs --saved-input-dtype $dt --nvme-dir "$disk" \
            --disk-saved-layers 2 ||
        { fail=$((fail + 1)); echo "FAILED: the saved-input runs ($dt)"; }
    check bitwise "$tmp/hs-$dt" "$tmp/hsd-$dt"
done
check train "$tmp/sdisk" 8 --nvme-dir "$disk" --disk-layers 0 --disk-saved-layers 2
check grep -q "saved input disk" "$tmp/sdisk.log"
check bitwise "$tmp/ram" "$tmp/sdisk"

# bench train: the same last loss with the last 4 layers' state on disk
# (which takes two warm-up steps to the RAM run's one: the same 4 steps)
bench() {
    $bin bench train --preset 1b --layers 4 --seq-len 512 --batch-size 2 --micro-batches 2 \
        "$@" 2>&1 | tee -a "$tmp/bench.log" | sed -n 's/^RESULT.* loss=\([^ ]*\).*/\1/p'
}
a=$(bench --steps 3 --gpu-adam-layers 0)
b=$(bench --steps 2 --gpu-adam-layers 0 --nvme-dir "$disk" --disk-layers 4)
echo "  bench train 1b --layers 4: loss $a in RAM, $b with 4 disk layers"
check test -n "$a" -a "$a" = "$b"
check grep -q "disk tier: the m and v of the last 4 layers" "$tmp/bench.log"
check test "$(grep -c '(warm-up)' "$tmp/bench.log")" = 3
# and with the weights of the last 2 of them on disk too (the planner's bench: the same
# random model, made a layer at a time for them)
w=$(bench --steps 2 --gpu-adam-layers 0 --nvme-dir "$disk" --disk-layers 4 --disk-weight-layers 2)
echo "  bench train 1b --layers 4: loss $a in RAM, $w with the weights of 2 layers on disk"
check test -n "$a" -a "$a" = "$w"
# and with the saved inputs of 2 layers on disk (their traffic in the plan's prediction)
c=$(bench --steps 3 --gpu-adam-layers 0 --nvme-dir "$disk" --disk-layers 0 --disk-saved-layers 2)
echo "  bench train 1b --layers 4: loss $a in RAM, $c with 2 disk-saved inputs"
check test -n "$a" -a "$a" = "$c"
check grep -q "disk tier: the saved inputs of 2 layers" "$tmp/bench.log"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
