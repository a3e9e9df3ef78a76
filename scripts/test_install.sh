#!/usr/bin/env bash
# The library as its users get it: `make install` into a fresh PREFIX, the
# example built there with pkg-config against the installed header and
# shared library, then run: the built-in tiny model, and a model made by
# the installed `megatrain init` fine-tuned on a JSONL file.
#
#   scripts/test_install.sh [BUILD]      (make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d /tmp/megatrain-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
make --no-print-directory -s install BUILD="$build" PREFIX="$prefix" >/dev/null
for f in bin/megatrain include/megatrain.h lib/libmegatrain.so lib/libmegatrain.a \
         lib/pkgconfig/megatrain.pc; do
    [ -e "$prefix/$f" ] || { echo "test_install: $prefix/$f was not installed" >&2; exit 1; }
done
"$prefix/bin/megatrain" --version
# the shared library exports every call of the header, and nothing else
declared=$(grep -o '\bmt_[a-z0-9_]*(' include/megatrain.h | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$prefix/lib/libmegatrain.so" | awk '$2 == "T" {print $3}' | sort -u)
[ "$declared" = "$exported" ] || { echo "test_install: exports differ from megatrain.h:" >&2;
    diff <(echo "$declared") <(echo "$exported") >&2; exit 1; }
# and is callable as it is from Python's ctypes
python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.mt_version.restype = ctypes.c_char_p
lib.mt_last_error.restype = ctypes.c_char_p
lib.mt_options_new.restype = ctypes.c_void_p
o = ctypes.c_void_p(lib.mt_options_new())
assert lib.mt_options_set(o, b"lr", b"fast") == -1
print("ctypes: megatrain", lib.mt_version().decode(), "--", lib.mt_last_error().decode())
lib.mt_options_free(o)' "$prefix/lib/libmegatrain.so"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion megatrain)" = "$("$prefix/bin/megatrain" --version | sed -n '1s/^megatrain //p')" ] \
    || { echo "test_install: pkg-config and megatrain --version disagree" >&2; exit 1; }
# shellcheck disable=SC2046
${CC:-cc} -std=c11 -Wall -Wextra -Werror examples/finetune.c $(pkg-config --cflags --libs megatrain) \
    -o "$tmp/finetune"
export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# ldd's whole output first: grep -q may stop reading early, and with
# pipefail ldd's broken pipe would then fail the check at random
ldd "$tmp/finetune" > "$tmp/ldd.txt"
grep -q "$prefix/lib/libmegatrain.so" "$tmp/ldd.txt" \
    || { echo "test_install: the example is not linked to the installed libmegatrain.so" >&2; exit 1; }
echo "== the built-in tiny model"
"$tmp/finetune" "$tmp/tiny" device=cpu
[ -f "$tmp/tiny/model/model.safetensors" ] || { echo "test_install: no saved model" >&2; exit 1; }
echo "== a model made by megatrain init, fine-tuned on prompt/completion data"
"$prefix/bin/megatrain" init --tokenizer tests/fixtures/tokenizer/tiny_bytelevel.json \
    --out "$tmp/init" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --max-pos 64
for i in $(seq 0 39); do
    echo "{\"prompt\": \"What is $i plus $((i + 1))? \", \"completion\": \"It is $((2 * i + 1)).\"}"
done > "$tmp/sft.jsonl"
"$tmp/finetune" "$tmp/sft" model="$tmp/init" data="$tmp/sft.jsonl" seq_len=32 batch_size=2 \
    micro_batches=2 epochs=3 lr=1e-3 device=cpu
[ -f "$tmp/sft/model/tokenizer.json" ] || { echo "test_install: no tokenizer beside the model" >&2; exit 1; }
echo "test_install: ok"
