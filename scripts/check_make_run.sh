#!/usr/bin/env bash
# make run builds only what the demo needs, in parallel (make test runs
# this): without a GPU the CPU build in BUILD/cpu, with one (a stand-in
# nvidia-smi reporting compute capability 9.0) its architecture alone in
# BUILD/sm_90. Only `make -n`: nothing is built.
#   scripts/check_make_run.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
fail() { echo "check_make_run: $*" >&2; exit 1; }

# no nvidia-smi on the PATH
mkdir "$fake/none"
for tool in make sh bash nproc head tr cc gcc sed find sort; do
    p=$(command -v "$tool") && ln -s "$p" "$fake/none/$tool"
done
out=$(PATH="$fake/none" make -n run BUILD="$build" 2>&1) || fail "make -n run failed:"$'\n'"$out"
grep -q -- "-j" <<<"$out" || fail "make run without a GPU does not build in parallel:"$'\n'"$out"
grep -q "BUILD=$build/cpu NVCC=" <<<"$out" || fail "make run without a GPU is not the CPU build"
grep -q "nvcc" <<<"$out" && fail "make run without a GPU compiles CUDA"

# a GPU of compute capability 9.0 and nvcc
printf '#!/bin/sh\necho 9.0\n' > "$fake/nvidia-smi"
chmod +x "$fake/nvidia-smi"
out=$(PATH="$fake:$PATH" make -n run BUILD="$build" NVCC=/usr/local/cuda/bin/nvcc 2>&1) || fail "make -n run failed:"$'\n'"$out"
grep -q "BUILD=$build/sm_90 CUDA_ARCHS=90" <<<"$out" || fail "make run with an sm_90 GPU:"$'\n'"$out"
grep -q "code=sm_90a" <<<"$out" || fail "make run with an sm_90 GPU does not compile sm_90a"
grep -q "code=sm_80" <<<"$out" && fail "make run with an sm_90 GPU compiles other architectures"
echo "check_make_run: CPU build without a GPU, one architecture with one, in parallel"
