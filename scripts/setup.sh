#!/usr/bin/env bash
# Installs the Debian packages megatrain builds against, when they are
# missing and we are root; otherwise says what to install.
set -euo pipefail
pkgs=(gcc make libcjson-dev libpcre2-dev libutf8proc-dev libyaml-dev libcriterion-dev gnuplot-nox
      libxxhash-dev clang libclang-rt-14-dev zlib1g-dev libzstd-dev libprotobuf-c-dev
      protobuf-c-compiler libisal-dev python3 python3-venv)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
    echo "megatrain setup: missing Debian packages: ${missing[*]}" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "megatrain setup: missing Debian packages: ${missing[*]}" >&2
    echo "  install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "megatrain setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
