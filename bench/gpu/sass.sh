#!/bin/sh
# bench/gpu/sass.sh [REV]: the flash kernels' main loops in SASS for sm_90, without a GPU:
# src/cuda/flash.cu compiled alone (nvcc -cubin, NVCC_EXTRA's flags too: a variant), its
# registers and spills (ptxas) and each kernel's loop's instructions by kind
# (bench/gpu/sass_loops.py); with REV, flash.cu and cuda/philox.cuh of that git revision
# first, for a before and after. Needs nvcc and cuobjdump (on PATH, or the copy inside
# PyTorch's triton package in bench/.venv-peers or build-cpu/cache/py-venv). Static counts:
# what a key tile executes is less (paths for edge tiles, odd J and masks are skipped).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "sass.sh: no nvcc (set NVCC=)" >&2; exit 2; }
if [ -z "${CUOBJDUMP:-}" ]; then
    CUOBJDUMP=$(command -v cuobjdump)
    for c in bench/.venv-peers/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump \
        build-cpu/cache/py-venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump; do
        [ -z "$CUOBJDUMP" ] && [ -x "$c" ] && CUOBJDUMP=$c
    done
fi
if [ -z "$CUOBJDUMP" ] || [ ! -x "$CUOBJDUMP" ]; then
    echo "sass.sh: no cuobjdump: install the CUDA toolkit's, or PyTorch (its triton package has one) in bench/.venv-peers" >&2
    exit 2
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
one() { # NAME SRC-DIR
    # shellcheck disable=SC2086 # NVCC_EXTRA is flags
    "$NVCC" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xptxas -v -I"$2" -Iinclude -Isrc -DDM_HAVE_CUDA \
        ${NVCC_EXTRA:-} -cubin "$2/cuda/flash.cu" -o "$tmp/$1.cubin" 2>"$tmp/$1.ptxas" || { cat "$tmp/$1.ptxas" >&2; exit 1; }
    echo "== $1: registers and spills (ptxas, sm_90)"
    awk '/Compiling entry/ { match($0, /_Z[0-9A-Za-z_]+/); n = substr($0, RSTART, RLENGTH) }
         /spill stores/ { sp = $0; sub(/.*frame, /, "", sp) }
         /Used [0-9]+ registers/ { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r);
                                   if (n ~ /fl_/) printf "  %-52s %3s registers, %s\n", n, r, sp }' "$tmp/$1.ptxas"
    "$CUOBJDUMP" -sass "$tmp/$1.cubin" >"$tmp/$1.sass" || exit 1
}
rev=
if [ $# -gt 0 ]; then
    mkdir -p "$tmp/old/cuda" && git show "$1:src/cuda/flash.cu" >"$tmp/old/cuda/flash.cu" &&
        git show "$1:src/cuda/philox.cuh" >"$tmp/old/cuda/philox.cuh" &&
        git show "$1:src/cuda/rowmath.cuh" >"$tmp/old/cuda/rowmath.cuh" || exit 1
    rev=$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.~^-' '_')
    one "$rev" "$tmp/old"
fi
one worktree src
python3 bench/gpu/sass_loops.py ${rev:+"$tmp/$rev.sass"} "$tmp/worktree.sass" | sed "s|$tmp/||"
