#!/usr/bin/env bash
# Held-out evaluation during a GPU training run equals `megatrain eval` of
# the checkpoint saved at the same step, on the GPU, with the run's batch
# shape (docs/metrics.md). Run by `make test-gpu` (DEVICE=cpu: the same on the
# CPU). Prints "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${BUILD:-build}/megatrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $*"; fi; }

python3 - "$tmp" <<'PY'
import json, random, sys
random.seed(5)
words = "the a river boat old man woman walked saw near by city morning night red green".split()
for name, n in (("train", 200), ("valid", 60)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(40))}) + "\n")
PY
$bin init --tokenizer tests/fixtures/tokenizer/tiny_bytelevel.json --out "$tmp/init" \
    --hidden 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --max-pos 128 >/dev/null
for prec in bf16 fp32; do
    out=$tmp/run-$prec
    train() {
        $bin train --model "$tmp/init" --data "$tmp/train.jsonl" --out "$out" --device ${DEVICE:-cuda} \
            --precision $prec --seq-len 64 --batch-size 4 --micro-batches 2 --steps 6 --lr 1e-3 \
            --warmup-steps 2 --save-dtype fp32 --eval-data "$tmp/valid.jsonl" --eval-every 3 --save-every 3 \
            --keep-last 5 --log-every 3 >/dev/null
    }
    check train
    for step in 3 6; do
        same() {
            local ck=$out/checkpoints/step-0000000$step
            [ "$step" = 6 ] && [ ! -d "$ck" ] && ck=$out/model
            local ours
            ours=$($bin eval --model "$ck" --tokenizer "$tmp/init/tokenizer.json" \
                --data "$tmp/valid.jsonl" --device ${DEVICE:-cuda} --precision $prec --seq-len 64 \
                --batch-size 4 --micro-batches 2 | sed -n 's/.*loss \([0-9.]*\),.*/\1/p')
            python3 - "$out/metrics.jsonl" "$step" "$ours" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "eval_loss" in l]
run = [r["eval_loss"] for r in rows if r["step"] == int(sys.argv[2])][0]
cli = float(sys.argv[3])
# megatrain eval prints 6 decimals; the same weights, batches and kernels
# give the same loss, so they must agree to that printed precision.
print(f"step {sys.argv[2]}: eval_loss in the run {run:.6f}, megatrain eval {cli:.6f}")
sys.exit(0 if abs(run - cli) <= 1.5e-6 else 1)
PY
        }
        check same
    done
done
echo "eval_roundtrip: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
