#!/usr/bin/env bash
# The Python package as its users get it, then every test of tests/python
# (make test runs this):
#   - a virtual environment in BUILD/venv that also sees the system's
#     packages (Debian's python3-pytest), made once;
#   - what tests/python/requirements.txt lists and it lacks, from PyPI (once);
#   - `pip install ./python`, which builds BUILD/libmegatrain.so with make and
#     puts a copy in the package (no build isolation: nothing is downloaded
#     after the first time);
#   - pytest on tests/python, the command and the library of BUILD.
#
#   scripts/test_python.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
venv=$build/venv
py=$venv/bin/python
pip=("$py" -m pip --disable-pip-version-check -q)
if [ ! -x "$py" ]; then
    python3 -m venv --system-site-packages "$venv" || {
        echo "test_python: cannot make a virtual environment (Debian: apt-get install python3-venv)" >&2
        exit 1
    }
fi
"${pip[@]}" install -r tests/python/requirements.txt
MEGATRAIN_BUILD=$build "${pip[@]}" install --no-build-isolation --no-deps ./python
export MEGATRAIN_CLI=$build/megatrain MEGATRAIN=$build/megatrain MEGATRAIN_BUILD=$build
unset MEGATRAIN_LIB
"$py" -m pytest -p no:cacheprovider -rs tests/python  # -rs: the reason of each skip
