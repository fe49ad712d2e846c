#!/bin/sh
# tests/check_spills.sh [BUILD]: the direct GEMM kernel's micro-tiles keep their
# accumulators in registers: no vector register is stored to or loaded from the stack in
# any tile_rows* function (clones included) of the compiled direct_avx2.o and
# direct_avx512.o (BUILD/src/cpu, default build).
#
# Why a test: how gcc allocates the AVX2 tile's 15 live vector registers (of 16) hangs on
# what it can prove about the callers. One change to how a caller blocks k (kc no longer
# bounded by a constant) made gcc 12 spill the accumulators to the stack in the inner loop,
# and every shape's AVX2 rate fell to 35% of the FMA rate, with every result still right.
# Run from anywhere: sh tests/check_spills.sh build
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
command -v objdump >/dev/null 2>&1 || { echo "check_spills: objdump not found (Debian: binutils)" >&2; exit 1; }
fail=0
for isa in avx2 avx512; do
    obj="$BUILD/src/cpu/direct_$isa.o"
    [ -f "$obj" ] || { echo "check_spills: $obj not built (make BUILD=$BUILD first)" >&2; exit 1; }
    out=$(objdump -d --no-show-raw-insn "$obj" | awk '
        /^[0-9a-f]+ <.*>:$/ { f = ($0 ~ /<tile_rows/); name = $2; next }
        f && /%[xyz]mm[0-9]+/ && /\(%rsp\)|\(%rbp\)/ { n[name]++ }
        END { for (k in n) printf "%s %d\n", k, n[k] }')
    nfun=$(objdump -d "$obj" | grep -c '<tile_rows[^>]*>:$' || true)
    if [ "$nfun" -eq 0 ]; then
        echo "check_spills: no tile_rows function in $obj (renamed? update this check)" >&2
        fail=1
    elif [ -n "$out" ]; then
        echo "check_spills: $obj: vector registers spilled to the stack in the micro-tile:" >&2
        echo "$out" | sed 's/^/  /' >&2
        fail=1
    else
        echo "check_spills: $obj: $nfun tile_rows function(s), no vector spills"
    fi
done
exit $fail
