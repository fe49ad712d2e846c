#!/bin/sh
# tests/check_spills.sh [CC] [CFLAGS]: the direct GEMM kernel's micro-tiles keep their
# accumulators in registers. src/cpu/direct_avx2.c and direct_avx512.c are compiled (CC,
# default cc; -O3 and CFLAGS, e.g. BLAS's include path) for this machine and for the machines
# the variants are for: AVX2-only (x86-64-v3, haswell, znver3: 16 vector registers) and
# Intel AVX-512 (skylake-avx512, icelake-server). In every innermost loop of every
# tile_rows* function, no vector register may be stored to or loaded from the stack.
# Stores outside the inner loops (the masked edge of C, once per tile) are allowed.
#
# Why a test: how gcc allocates the AVX2 tile's 15 live vector registers (of 16) hangs on
# what it can prove about the callers. One change to how a caller split k (kc no longer
# bounded by a constant) made gcc 12 spill the accumulators in the inner loop. Every AVX2
# rate fell to 35% of the FMA rate, and every result stayed right.
# A -march value this compiler does not know is left out, and said so.
# Run from anywhere: sh tests/check_spills.sh cc "-I/usr/include/x86_64-linux-gnu/openblas-openmp"
set -eu
cd "$(dirname "$0")/.."
CC=${1:-cc}
EXTRA=${2:-}
command -v objdump >/dev/null 2>&1 || { echo "check_spills: objdump not found (Debian: binutils)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
checked=0
for isa in avx2 avx512; do
    for arch in native x86-64-v3 haswell znver3 skylake-avx512 icelake-server; do
        obj="$tmp/$isa-$arch.o"
        # shellcheck disable=SC2086 # CC may be a command with arguments (ccache gcc), EXTRA a list of flags
        if ! $CC -O3 -march="$arch" -std=c11 -D_GNU_SOURCE -fopenmp -Iinclude -Isrc $EXTRA \
            -c "src/cpu/direct_$isa.c" -o "$obj" 2>"$tmp/err"; then
            if grep -q "march" "$tmp/err"; then
                echo "check_spills: $CC does not know -march=$arch: left out"
                continue
            fi
            cat "$tmp/err" >&2
            exit 1
        fi
        # innermost loops: backward branches whose range holds no other one; then the vector
        # registers moved to or from the stack inside them
        res=$(objdump -d --no-show-raw-insn "$obj" | awk '
            function hex(h,   i, v) { v = 0; h = tolower(h); for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return v }
            /^[0-9a-f]+ <.*>:$/ { f = ($0 ~ /<tile_rows/); if (f) nfun++; next }
            !f { next }
            /^ *[0-9a-f]+:\t/ {
                split($0, p, ":"); sub(/^ +/, "", p[1]); a = hex(p[1]); rest = substr($0, index($0, ":") + 2)
                n++; addr[n] = a; text[n] = rest
                split(rest, w, /[ \t]+/)
                if (w[1] ~ /^j/ && w[2] ~ /^[0-9a-f]+$/) { t = hex(w[2]); if (t < a) { nl++; lo[nl] = t; hi[nl] = a } }
            }
            END {
                bad = 0
                for (i = 1; i <= nl; i++) {
                    inner = 1
                    for (j = 1; j <= nl; j++)
                        if (j != i && lo[j] >= lo[i] && hi[j] <= hi[i] && (lo[j] != lo[i] || hi[j] != hi[i])) inner = 0
                    if (!inner) continue
                    for (k = 1; k <= n; k++)
                        if (addr[k] >= lo[i] && addr[k] <= hi[i] && text[k] ~ /%[xyz]mm[0-9]+/ && text[k] ~ /\(%[re][sb]p\)/) bad++
                }
                printf "%d %d %d\n", nfun + 0, nl + 0, bad
            }')
        # shellcheck disable=SC2086 # three numbers
        set -- $res
        if [ $# -ne 3 ]; then
            echo "check_spills: $isa -march=$arch: could not read the disassembly (objdump, awk)" >&2
            exit 1
        fi
        checked=$((checked + 1))
        if [ "$1" -eq 0 ] || [ "$2" -eq 0 ]; then
            echo "check_spills: $isa -march=$arch: no tile_rows loop found ($1 functions; renamed? update this check)" >&2
            fail=1
        elif [ "$3" -ne 0 ]; then
            echo "check_spills: $isa -march=$arch: $3 vector moves to or from the stack inside the micro-tile's inner loops" >&2
            fail=1
        fi
    done
done
[ "$fail" = 0 ] && echo "check_spills: the direct kernel's micro-tiles, $checked builds (avx2, avx512 x -march), no spill in an inner loop"
exit $fail
