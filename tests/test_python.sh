#!/bin/sh
# tests/test_python.sh: the Python package (python/, dmove.torch) installed from the source
# tree with the libdmove.so of this build, and its tests (tests/python, pytest) against
# transformers. `make test` runs it with DMOVE and DMOVE_LIB set.
#
# DMOVE_PYTHON: the Python to use; it must import torch, transformers, accelerate
# (transformers' Trainer), pytest and setuptools. Without it: python3 when it has them all,
# else a virtual environment made once in the build folder's cache/py-venv (pip, from the
# network: torch's CPU wheel, about 200 MB, or PyPI's where that index is unreachable,
# unless python3 has torch and transformers, which it then sees); without python3-venv or
# the network this test fails saying what to do. The package is installed with pip --target into a temporary folder (no network, no
# build isolation, the environment left as it was), and imported from there with the
# library it carries (DMOVE_LIB unset).
set -eu
cd "$(dirname "$0")/.."
LIB=${DMOVE_LIB:-$(dirname "${DMOVE:-build/dmove}")/libdmove.so}
case $LIB in /*) ;; *) LIB=$(pwd)/$LIB ;; esac # pip builds elsewhere
need='import torch, transformers, accelerate, pytest, setuptools'
if [ -n "${DMOVE_PYTHON:-}" ]; then
    PY=$DMOVE_PYTHON
elif python3 -c "$need" 2>/dev/null; then
    PY=python3
else
    venv=$(cd "$(dirname "${DMOVE:-build/dmove}")" && pwd)/cache/py-venv
    if ! "$venv/bin/python" -c "$need" 2>/dev/null; then
        echo "making $venv (once): torch, transformers, accelerate, pytest"
        rm -rf "$venv"
        if python3 -c 'import torch, transformers' 2>/dev/null; then site=--system-site-packages; else site=; fi
        # shellcheck disable=SC2086 # site is one word or none
        python3 -m venv $site "$venv" ||
            { echo "FAIL: python3 -m venv failed: apt-get install python3-venv (or set DMOVE_PYTHON)"; exit 1; }
        if [ -z "$site" ]; then # the CPU wheel where its index answers, else PyPI's (the CUDA
            # build: its nvidia-* wheels, about 3 GB, are never loaded on the CPU)
            "$venv/bin/pip" install -q --retries 1 --timeout 20 torch --index-url https://download.pytorch.org/whl/cpu ||
                "$venv/bin/pip" install -q torch ||
                { echo "FAIL: pip could not install torch (the network?); or set DMOVE_PYTHON"; exit 1; }
        fi
        "$venv/bin/pip" install -q transformers accelerate pytest setuptools ||
            { echo "FAIL: pip could not install transformers, accelerate, pytest (the network?)"; exit 1; }
    fi
    PY=$venv/bin/python
fi
[ -f "$LIB" ] || { echo "FAIL: no $LIB: build it first (make $LIB, or make python)"; exit 1; }
command -v "$PY" >/dev/null 2>&1 || { echo "FAIL: no $PY (set DMOVE_PYTHON to a Python with torch, transformers, accelerate and pytest)"; exit 1; }
missing=$("$PY" - <<'PYEOF'
import importlib
miss = []
for m in ("torch", "transformers", "accelerate", "pytest", "setuptools"):
    try:
        importlib.import_module(m)
    except Exception:
        miss.append(m)
print(" ".join(miss))
PYEOF
)
if [ -n "$missing" ]; then
    echo "FAIL: $PY cannot import: $missing"
    echo "  make a virtual environment with them, e.g.:"
    echo "    python3 -m venv /opt/dmove-py && /opt/dmove-py/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu"
    echo "    /opt/dmove-py/bin/pip install transformers accelerate pytest setuptools"
    echo "  and run with DMOVE_PYTHON=/opt/dmove-py/bin/python"
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dmove-python.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
repo=$(pwd)
DMOVE_LIB="$LIB" "$PY" -m pip install -q --no-deps --no-build-isolation --no-index \
    --target "$tmp/site" ./python
[ -f "$tmp/site/dmove/libdmove.so" ] || { echo "FAIL: the installed package carries no libdmove.so"; exit 1; }
cd "$tmp"
where=$(env -u DMOVE_LIB PYTHONPATH="$tmp/site" "$PY" -c 'import dmove.torch, dmove; print(dmove.__file__, dmove.library_path())')
echo "installed: $where"
case "$where" in "$tmp/site/"*) ;; *) echo "FAIL: dmove imported from elsewhere"; exit 1;; esac
env -u DMOVE_LIB PYTHONPATH="$tmp/site" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" \
    "$PY" -m pytest -q -p no:cacheprovider "$repo/tests/python"
echo "test_python: ok"
