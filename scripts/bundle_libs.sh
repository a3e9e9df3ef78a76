#!/usr/bin/env bash
# Copies the shared libraries that megatrain's binaries load from Debian
# packages (cJSON, PCRE2, utf8proc, libyaml, Criterion and its dependencies)
# into lib/ beside the first binary (build/lib), so the built binaries run
# on a GPU machine that has the CUDA toolkit but not these packages. The C library, the CUDA libraries and
# the GPU driver are left to the target machine.
set -euo pipefail
out=$(dirname "$1")/lib
mkdir -p "$out"
skip='^(linux-vdso|libc\.|libm\.|libdl\.|librt\.|libpthread\.|ld-linux|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcudart\.|libcublas|libcublasLt\.)'
for bin in "$@"; do
    ldd "$bin" | awk '/=> \//{print $1, $3}' | while read -r name path; do
        [[ "$name" =~ $skip ]] && continue
        cp -L "$path" "$out/$name"
    done
done
echo "bundled $(ls "$out" | wc -l) libraries into $out"
