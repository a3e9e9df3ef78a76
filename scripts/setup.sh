#!/usr/bin/env bash
# Installs the Debian packages megatrain builds against, and those its
# Python tests need, when they are missing and we are root; otherwise says
# what to install. --check: are the build's packages there (no install)?
# The Python tests' PyPI packages (tests/python/requirements.txt: pyarrow,
# tensorboard, datasets, wandb, mlflow-skinny) go into a virtual environment
# in the build folder: scripts/test_python.sh.
set -euo pipefail
pkgs=(gcc make libcjson-dev libpcre2-dev libutf8proc-dev libyaml-dev libcriterion-dev gnuplot-nox
      libxxhash-dev clang libclang-rt-14-dev pkg-config zlib1g-dev libzstd-dev
      libprotobuf-c-dev protobuf-c-compiler libisal-dev liburing-dev)
# the Python package and its tests: a venv with pip, pytest
python_pkgs=(python3 python3-venv python3-pip python3-pytest)
[ "${1:-}" = "--check" ] || pkgs+=("${python_pkgs[@]}")
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
