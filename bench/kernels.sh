#!/bin/sh
# bench/kernels.sh: builds libdmove.a (CPU backend) and bench/kernels.c, then runs it: dmove's
# own GEMM kernel on each instruction set this CPU has, against OpenBLAS and BLIS, on one
# BERT layer's contractions, as GFLOP/s and % of the FMA rate measured in the same run.
#
# Usage: sh bench/kernels.sh [--out FILE] [kernels options: --batch B --seq J --hidden I
#                            --ffn U --heads H --threads T --rounds R --only S --tsv]
# BERT-large's layer at b=2 j=512: --batch 2 --seq 512 --hidden 1024 --ffn 4096 --heads 16
# Needs: gcc, libopenblas-openmp-dev; libblis-openmp-dev for the BLIS column (dlopen'ed).
# Run on an idle machine: the table is only as good as the quiet it was taken in.
set -eu
out=""
if [ "${1:-}" = "--out" ]; then out="$2"; shift 2; fi
cd "$(dirname "$0")/.."
make --no-print-directory CUDA=0 BUILD=build-cpu build-cpu/libdmove.a >/dev/null
cc -O3 -march=native -fopenmp -Iinclude -Isrc $(pkg-config --cflags openblas 2>/dev/null || true) \
    bench/kernels.c build-cpu/libdmove.a -o build-cpu/bench_kernels \
    $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lcjson -ldl -lm
{
    echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
        "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
        "($(grep -o -w 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//'))"
    build-cpu/bench_kernels "$@"
} | if [ -n "$out" ]; then tee "$out"; else cat; fi
