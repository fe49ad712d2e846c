#!/bin/sh
# bench/tune_sizes.sh: tunes the three sizes of issue 4 (BERT-base, a BERT-large-shaped
# layer that fits 24 GiB, a small one) and prints each tune's report, its plan's verified
# speedup (default vs tuned step, interleaved) and the tuning time. Measures everything
# afresh (--no-cache): the numbers are this run's.
# Usage: sh bench/tune_sizes.sh [DIR for plans and plots, default /tmp/dmove-tune]
set -eu
D=${DMOVE:-build/dmove}
OUT=${1:-/tmp/dmove-tune}
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in "base:--preset bert-base" \
           "small:--batch 32 --seq 128 --hidden 256 --heads 4 --ffn 1024" \
           "large4x512:--batch 4 --seq 512 --hidden 1024 --heads 16 --ffn 4096"; do
    name=${cfg%%:*} args=${cfg#*:}
    echo
    echo "=== $name: dmove tune $args"
    # shellcheck disable=SC2086 # args is a list of options
    $D tune $args --out "$OUT/$name.json" --svg "$OUT/$name.svg" --verify 9 --no-cache 2>/dev/null
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
done
