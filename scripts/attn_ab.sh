#!/usr/bin/env bash
# A/B of attention kernels: runs several attn_bench binaries (bench/attn_bench.cu,
# each built from one version of the kernels) in turn, ROUNDS times over, on one
# GPU, and prints each shape's forward and backward TFLOPS as the range over the
# rounds, a column per binary. Back-to-back runs on one machine are the only
# comparison that counts: instances of one GPU kind differ by several percent.
#
#   scripts/attn_ab.sh OUTDIR BIN [BIN ...]     (ROUNDS=2 by default)
#
# Logs: OUTDIR/<binary name>.<round>.log.
set -euo pipefail
out=$1
shift
rounds=${ROUNDS:-2}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    for b in "$@"; do
        "$b" > "$out/$(basename "$b").$r.log"
    done
done
python3 - "$out" "$rounds" "$@" <<'EOF'
import sys, os
out, rounds, bins = sys.argv[1], int(sys.argv[2]), [os.path.basename(b) for b in sys.argv[3:]]
rows, order = {}, []
for b in bins:
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{b}.{r}.log"):
            f = line.split()
            if not f or f[0] not in ("bf16", "fp32") or "|" not in f:
                continue
            key = " ".join(f[:7])
            i = f.index("|")
            fwd, bwd = float(f[i + 2]), float(f[i + 6])
            if key not in rows:
                rows[key] = {}
                order.append(key)
            rows[key].setdefault(b, []).append((fwd, bwd))
def rng(v):
    return f"{min(v):.1f}" if len(v) == 1 else f"{min(v):.1f}-{max(v):.1f}"
print("shape (mode T B B*T heads HD doc) | " + " | ".join(f"{b} fwd, bwd" for b in bins))
for k in order:
    cells = []
    for b in bins:
        v = rows[k].get(b, [])
        cells.append(f"{rng([x[0] for x in v])}, {rng([x[1] for x in v])}" if v else "-")
    print(f"{k} | " + " | ".join(cells))
EOF
