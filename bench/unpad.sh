#!/bin/sh
# bench/unpad.sh: issue 25's point 3 on the CPU: the layer's step padded against unpadded
# (`dmove bench --lengths`, both on the same drawn batches, interleaved) at half fill
# (uniform lengths), at full fill (no padding: what unpadding costs there), on the lengths
# of real `--pairs` batches (LENGTHS, default bench/results/unpad-2026-11-27/pairs-lengths.txt:
# 2000 sequences of `dmove batches --pairs` over the Debian corpus, fill 0.565), for
# BERT-base at b=8 j=128 and b=2 j=512; each ROUNDS times (default 3). Then the whole
# model: `dmove pretrain --pairs` (4 layers, i=256, b=16 j=128, 25 steps) on the same corpus,
# unpadded (the default) and --no-unpad, alternated, ROUNDS times each: the summary's time
# per step.
# Usage: sh bench/unpad.sh [ROUNDS]     (DMOVE=build-cpu/dmove by default)
set -eu
rounds=${1:-3}
DMOVE=${DMOVE:-build-cpu/dmove}
LENGTHS=${LENGTHS:-bench/results/unpad-2026-11-27/pairs-lengths.txt}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores," \
     "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2, no AVX-512')"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo -)"
run() { # run LABEL ARGS...
    label=$1
    shift
    for r in $(seq "$rounds"); do
        out=$("$DMOVE" bench "$@" --reps 10 --warmup 2 2>/dev/null)
        pad=$(echo "$out" | awk '$1 == "padded" { print $2 }')
        unp=$(echo "$out" | awk '$1 == "unpadded" && $2 != "speedup" { print $2 }')
        fill=$(echo "$out" | sed -n 's/^fill (real tokens \/ b x j): \([0-9.]*\).*/\1/p')
        sp=$(echo "$out" | sed -n 's/^unpadded speedup.*: //p')
        printf '%-34s round %d: fill %s  padded %8s ms  unpadded %8s ms  speedup %s\n' "$label" "$r" "$fill" "$pad" \
            "$unp" "$sp"
    done
}
echo "== dmove bench --lengths SPEC (BERT-base widths, dropout 0.1, 2 threads; medians of 10 batches)"
run "b=8 j=128 uniform:32-96" --batch 8 --seq 128 --lengths uniform:32-96
run "b=8 j=128 full (128-128)" --batch 8 --seq 128 --lengths uniform:128-128
run "b=8 j=128 real --pairs lengths" --batch 8 --seq 128 --lengths "$LENGTHS"
run "b=2 j=512 uniform:128-384" --batch 2 --seq 512 --lengths uniform:128-384
echo "== dmove pretrain --pairs, 4 layers i=256 h=4 u=1024, b=16 j=128, 25 steps (English Debian text)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tok=tests/text/tok/bert-base-uncased.json
zcat tests/text/corpus/man-rendered.txt.gz tests/text/corpus/debian-reference.txt.gz >"$tmp/corpus.txt"
"$DMOVE" prepare --tokenizer "$tok" --out "$tmp/data" --valid-fraction 0.05 "$tmp/corpus.txt" >/dev/null 2>&1
for r in $(seq "$rounds"); do
    for mode in "" --no-unpad; do
        line=$("$DMOVE" pretrain --data "$tmp/data" --tokenizer "$tok" --layers 4 --hidden 256 --heads 4 --ffn 1024 \
            --seq 128 --batch 16 --steps 25 --eval-every 0 --eval-batches 1 --pairs $mode 2>&1 | grep '^time per step')
        printf '%-12s round %d: %s\n' "${mode:-unpadded}" "$r" "$line"
    done
done
