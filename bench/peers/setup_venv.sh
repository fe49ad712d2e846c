#!/bin/sh
# bench/peers/setup_venv.sh: make the virtual environment the torch.compile, JAX and
# sentence-transformers peers run in (bench/.venv-peers, git-ignored), from PyPI.
#
# Usage: sh bench/peers/setup_venv.sh [--python PY] [--venv DIR]
#   --python PY  the interpreter to build the venv from (default: python3 on PATH, which
#                here is pyenv's 3.11; Debian's /usr/bin/python3 is the one the 1.13 eager
#                peer uses and is not touched)
#   --venv DIR   where to put it (default bench/.venv-peers)
#
# torch: the CPU-only wheel from https://download.pytorch.org/whl/cpu when that index is
# reachable, otherwise plain PyPI (the Linux wheel there is the CUDA build; it pulls the
# nvidia-* runtime wheels, ~3 GB, which the CPU run never loads). torch.compile's inductor
# backend compiles its C++ kernels with the system's g++ (build-essential), nothing else.
# jax: jax[cpu] from PyPI (jax + jaxlib, XLA's CPU backend).
# Re-running is cheap: pip sees what is installed.
set -eu
py=python3
venv=""
while [ $# -gt 0 ]; do
    case "$1" in
        --python) py="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        *) echo "setup_venv.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -n "$venv" ] || venv="$root/bench/.venv-peers"

"$py" -c 'import sys; assert sys.version_info >= (3, 9), sys.version' \
    || { echo "setup_venv.sh: $py is older than 3.9 (torch 2 and jax need >= 3.9)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip wheel

if "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    echo "setup_venv.sh: torch already installed: $("$venv/bin/python" -c 'import torch; print(torch.__version__)')" >&2
elif curl -fsS -o /dev/null --max-time 15 https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    echo "setup_venv.sh: torch from the CPU index (download.pytorch.org/whl/cpu)" >&2
    $pip install -q torch --index-url https://download.pytorch.org/whl/cpu
else
    echo "setup_venv.sh: download.pytorch.org unreachable: torch from PyPI (CUDA build, CPU used)" >&2
    $pip install -q torch
fi
$pip install -q "jax[cpu]" numpy
$pip install -q sentence-transformers # bench/peers/embed_peers.py's peer

"$venv/bin/python" - <<'PY'
import torch, jax, jaxlib, numpy
print(f"setup_venv.sh: torch {torch.__version__} (cuda build: {torch.version.cuda}), "
      f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {numpy.__version__}")
PY
