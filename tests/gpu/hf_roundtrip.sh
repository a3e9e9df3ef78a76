#!/usr/bin/env bash
# A model trained and saved by megatrain on the GPU loads in Hugging Face
# transformers with from_pretrained and gives the same logits as megatrain.
# Run by `make test-gpu` on the GPU machine (python3 with torch and
# transformers there). Prints "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${BUILD:-build}/megatrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $*"; fi; }

python3 - "$tmp/data.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = "the a river boat old man woman walked saw near by city morning night red green".split()
with open(sys.argv[1], "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(40))}) + "\n")
PY
$bin init --tokenizer tests/fixtures/tokenizer/tiny_bytelevel.json --out "$tmp/init" \
    --hidden 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --max-pos 128 >/dev/null
for prec in bf16 fp32; do
    run() {
        $bin train --model "$tmp/init" --data "$tmp/data.jsonl" --out "$tmp/run-$prec" \
            --device cuda --precision $prec --seq-len 64 --batch-size 4 --micro-batches 2 \
            --steps 10 --lr 1e-3 --warmup-steps 2 --save-dtype fp32 --log-every 5 &&
        $bin eval --model "$tmp/run-$prec/model" --data "$tmp/data.jsonl" --device cuda \
            --precision fp32 --seq-len 64 --batch-size 2 --max-batches 1 \
            --dump-logits "$tmp/ours-$prec.safetensors"
    }
    check run
    compare() {
        python3 - "$tmp/run-$prec/model" "$tmp/ours-$prec.safetensors" <<'PY'
import sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
torch.backends.cuda.matmul.allow_tf32 = False
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32,
                                             attn_implementation="eager").cuda().eval()
ours = load_file(sys.argv[2])
ids = ours["input_ids"].long().cuda()[None]
with torch.no_grad():
    ref = model(ids).logits[0].float().cpu()
err = ((ours["logits"] - ref).norm() / ref.norm()).item()
# fp32 on both sides (TF32 off): only summation order differs, ~1e-6;
# 1e-4 leaves margin and fails on any layout or naming mistake.
print(f"from_pretrained logits vs megatrain: rel err {err:.2e}")
sys.exit(0 if err < 1e-4 else 1)
PY
    }
    check compare
done
echo "hf_roundtrip: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
