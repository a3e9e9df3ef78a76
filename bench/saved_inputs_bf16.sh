#!/usr/bin/env bash
# The effect of bf16 saved inputs on the loss: the same model trained twice
# on the same data with every saved input waiting in host RAM
# (--host-saved-inputs), once in fp32 (the default) and once in bf16
# (--saved-input-dtype bf16), then both runs' training and held-out losses.
# Needs a GPU.
#   bench/saved_inputs_bf16.sh DATA.jsonl TOKENIZER.json [EPOCHS]
# Prints a table: steps, the mean training loss of the last 20 steps and the
# last held-out loss of each run, and their differences. LOGS=DIR keeps the
# runs' logs and metrics there.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$1 tok=$2 epochs=${3:-4}
bin=${BUILD:-build}/megatrain
tmp=$(mktemp -d)
keep() { # LOGS: the runs' logs and metrics kept
    [ -n "${LOGS:-}" ] || return 0
    mkdir -p "$LOGS" && cp "$tmp"/*.log "$LOGS"/
    for d in fp32 bf16; do cp "$tmp/$d/metrics.jsonl" "$LOGS/$d.metrics.jsonl" 2>/dev/null; done
}
trap 'keep; rm -rf "$tmp"' EXIT
# the last 50 documents held out
head -n -50 "$data" >"$tmp/train.jsonl"
tail -n 50 "$data" >"$tmp/eval.jsonl"
$bin init --tokenizer "$tok" --out "$tmp/init" --hidden 512 --layers 8 --heads 8 --kv-heads 4 \
    --ffn 1408 --max-pos 1024 >/dev/null
for dtype in fp32 bf16; do
    $bin train --model "$tmp/init" --data "$tmp/train.jsonl" --eval-data "$tmp/eval.jsonl" \
        --out "$tmp/$dtype" --seq-len 1024 --batch-size 8 --micro-batches 2 --steps 0 \
        --epochs "$epochs" --lr 1e-3 --warmup-steps 20 --eval-every 100 --eval-batches 4 \
        --device cuda --host-saved-inputs --saved-input-dtype "$dtype" --save-every 0 \
        >"$tmp/$dtype.log" 2>&1 ||
        { tail -5 "$tmp/$dtype.log"; exit 1; }
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def read(dtype):
    rows = [json.loads(l) for l in open(f"{tmp}/{dtype}/metrics.jsonl")]
    train = [r["loss"] for r in rows if "loss" in r]
    ev = [r["eval_loss"] for r in rows if "eval_loss" in r]
    if not ev:
        sys.exit(f"{dtype}: no held-out loss in metrics.jsonl")
    return sum(train[-20:]) / len(train[-20:]), ev[-1], train, len(train)
a, b = read("fp32"), read("bf16")
first = next(i for i, (x, y) in enumerate(zip(a[2], b[2])) if x != y) if a[2] != b[2] else None
print(f"| saved inputs | steps | train loss (last 20) | held-out loss |")
print(f"| --- | --- | --- | --- |")
print(f"| fp32 | {a[3]} | {a[0]:.4f} | {a[1]:.4f} |")
print(f"| bf16 | {b[3]} | {b[0]:.4f} | {b[1]:.4f} |")
print(f"difference: train {b[0] - a[0]:+.4f} ({(b[0] - a[0]) / a[0]:+.2%}), held-out "
      f"{b[1] - a[1]:+.4f} ({(b[1] - a[1]) / a[1]:+.2%}); losses first differ at step "
      f"{first + 1 if first is not None else 'none'}")
PY
