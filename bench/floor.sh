#!/bin/sh
# bench/floor.sh: issue 26's point 3, the layer's training step against its compute floor
# (its flop at the vector FMA rate `dmove probe` measures), the two taken in turn ROUNDS
# times (default 5), so that a busy hour moves both: per round the probed rate, the floor,
# the fused step (`dmove bench --schedule fused`, 10 reps after 3 warm-up, default plan)
# and the step over the floor; then the medians. The rate on a shared VM drifts 5-10%
# within minutes: the ratio of one round is the one to read, not a step against another
# round's rate.
# Usage: sh bench/floor.sh [ROUNDS] [dmove bench size options]
#   sh bench/floor.sh 5                                                (BERT-base, b=8 j=128)
#   sh bench/floor.sh 5 --batch 2 --seq 512 --hidden 1024 --heads 16 --ffn 4096  (BERT-large-shaped)
# DMOVE=build-cpu/dmove by default; THREADS (default: all cores).
set -eu
rounds=${1:-5}
[ $# -gt 0 ] && shift
DMOVE=${DMOVE:-build-cpu/dmove}
THREADS=${THREADS:-$(nproc)}
[ -x "$DMOVE" ] || { echo "floor.sh: $DMOVE is not built (make, or DMOVE=path)" >&2; exit 1; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores," \
     "$(grep -qw amx_tile /proc/cpuinfo && echo 'AMX, ')$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2, no AVX-512')"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo -)" \
     " threads: $THREADS  sizes: ${*:-BERT-base defaults}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
r=1
while [ "$r" -le "$rounds" ]; do
    fma=$("$DMOVE" probe --threads "$THREADS" --no-save 2>&1 | sed -n 's/.*vector FMA rate: \([0-9.]*\) GFLOP.*/\1/p' | head -1)
    js=$("$DMOVE" bench --json --schedule fused "$@" --threads "$THREADS" --reps 10 --warmup 3 2>/dev/null | tr -d ' \t\n')
    step=$(echo "$js" | sed -n 's/.*"step_ms":\([0-9.]*\).*/\1/p' | head -1)
    flop=$(echo "$js" | sed -n 's/.*"flop":\([0-9.]*\).*/\1/p' | head -1)
    [ -n "$fma" ] && [ -n "$step" ] && [ -n "$flop" ] ||
        { echo "floor.sh: round $r: no rate, step or flop read (probe '$fma', step '$step', flop '$flop')" >&2; exit 1; }
    awk -v f="$fma" -v s="$step" -v fl="$flop" -v r="$r" 'BEGIN {
        g = fl / 1e9; fm = g / f * 1000
        printf "round %d: FMA %.1f GFLOP/s  %.2f GFLOP  floor %.1f ms  step %.1f ms  %.3fx\n", r, f, g, fm, s, s / fm }' |
        tee -a "$out"
    r=$((r + 1))
done
med() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
step=$(sed -n 's/.*step \([0-9.]*\) ms.*/\1/p' "$out" | med)
ratio=$(sed -n 's/.* \([0-9.]*\)x$/\1/p' "$out" | med)
echo "median of $rounds rounds: step $step ms, ${ratio}x its floor"
