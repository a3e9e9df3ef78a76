#!/usr/bin/env bash
# On the H100 device: the 8B shape at 64k tokens per step, as a benchmark
# and as a real training run of a fresh model on brown.jsonl (data in
# $DATA: brown.jsonl and the Llama-3 tokenizer.json); logs to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/megatrain-out}
DATA=${DATA:-.devdata}
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
free -g | head -2
timeout 260 build/megatrain bench train --preset 8b --steps 2 > "$OUT/bench8b.log" 2>&1
build/megatrain init --tokenizer "$DATA/tokenizer.json" --out /tmp/m8b --hidden 4096 --layers 32 \
    --heads 32 --kv-heads 8 --ffn 14336 --untied > "$OUT/init.log" 2>&1
timeout 300 build/megatrain train --model /tmp/m8b --data "$DATA/brown.jsonl" --steps 10 \
    --seq-len 2048 --batch-size 8 --micro-batches 4 --log-every 1 --save-every 0 \
    --warmup-steps 2 --lr 1e-5 --out /tmp/r8b > "$OUT/train8b.log" 2>&1 &
pid=$!
# the weights are in the host store once the device line is printed: free the disk for the save
for _ in $(seq 300); do grep -q "^device:" "$OUT/train8b.log" && break; sleep 1; done
rm -rf /tmp/m8b/*.safetensors
wait $pid; echo "train exit $?" >> "$OUT/train8b.log"
