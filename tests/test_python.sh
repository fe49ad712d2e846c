#!/bin/sh
# tests/test_python.sh: the Python package (python/, dmove.torch) installed from the source
# tree with the libdmove.so of this build, and its tests (tests/python, pytest) against
# transformers. `make test` runs it with DMOVE and DMOVE_LIB set.
#
# DMOVE_PYTHON: the Python to use (default python3); it must import torch, transformers,
# accelerate (transformers' Trainer) and pytest, else this test fails saying what to
# install (.ci/run makes such a virtual environment). The package is installed with pip
# --target into a temporary folder (no network, no build isolation, the environment left
# as it was), and imported from there with the library it carries (DMOVE_LIB unset).
set -eu
cd "$(dirname "$0")/.."
PY=${DMOVE_PYTHON:-python3}
LIB=${DMOVE_LIB:-$(dirname "${DMOVE:-build/dmove}")/libdmove.so}
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
