#!/usr/bin/env bash
# Runs the README's walkthrough exactly as written (the block after the
# "walkthrough" marker), except that the first `train` is interrupted with
# SIGINT after $STOP_AFTER seconds, as a user pressing Ctrl-C would.
set -euo pipefail
cd "$(dirname "$0")/.."
STOP_AFTER=${STOP_AFTER:-12}
block=$(awk '/<!-- walkthrough -->/{f=1; next} f && /^```sh/{g=1; next} g && /^```/{exit} g' README.md)
trains=0
while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    # On a GPU machine without the build dependencies (or gnuplot), the
    # prebuilt binaries are used and the plot is drawn elsewhere.
    if [[ "$line" == "make build" && -n "${SKIP_BUILD:-}" ]]; then echo "\$ $line (skipped: prebuilt)"; continue; fi
    if [[ "$line" == "build/megatrain plot "* && -n "${SKIP_PLOT:-}" ]]; then echo "\$ $line (skipped)"; continue; fi
    echo "\$ $line"
    if [[ "$line" == "build/megatrain train "* && $trains -eq 0 ]]; then
        trains=1
        set +e
        log=$(mktemp)
        timeout --foreground --preserve-status -s INT "$STOP_AFTER" bash -c "$line" | tee "$log"
        rc=${PIPESTATUS[0]}
        set -e
        # --foreground: one SIGINT to megatrain alone, as one Ctrl-C is
        # (plain timeout signals the process group too: a second SIGINT
        # means "quit now"). 130: stopped after saving a checkpoint.
        [[ $rc -eq 130 ]] || { echo "walkthrough: expected the interrupted run to exit 130, got $rc"; exit 1; }
        grep -q "saving a checkpoint" "$log" || { echo "walkthrough: the interrupted run saved no checkpoint"; exit 1; }
        rm -f "$log"
        continue
    fi
    bash -c "$line"
done <<< "$block"
