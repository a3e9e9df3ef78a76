#!/usr/bin/env bash
# The Python environment of tests/python: a virtual environment (default
# build/venv) with tests/python/requirements.txt from PyPI, made once and
# remade when the requirements change. Needs python3 and python3-venv
# (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv}
req=tests/python/requirements.txt
stamp=$venv/requirements.installed
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp" 2>/dev/null; then exit 0; fi
echo "megatrain setup: Python test environment in $venv"
rm -rf "$venv"
python3 -m venv "$venv"
if ! "$venv/bin/pip" install -q -r "$req"; then
    echo "megatrain setup: installing $req into $venv failed (is PyPI reachable?)" >&2
    exit 1
fi
cp "$req" "$stamp"
