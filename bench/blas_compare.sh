#!/bin/sh
# bench/blas_compare.sh: builds bench/blas_compare.c against the OpenMP builds of OpenBLAS
# and BLIS from Debian, runs the two binaries interleaved (ABBA order, several rounds, 2
# threads), and writes a table of medians and BLIS/OpenBLAS ratios for the contractions of
# one BERT training step to bench/results/blas_compare-<date>.txt (and stdout).
#
# Usage: sh bench/blas_compare.sh [--rounds N] [--reps R] [--threads T] [--out FILE]
#                                 [--no-wait] [-- extra blas_compare options: --batch B ...]
# Each run waits for an idle machine and is repeated if other jobs used the CPUs meanwhile
# (see clean_run below); --no-wait turns both off.
# Needs: gcc, libopenblas-openmp-dev, libblis-openmp-dev, python3 (for the table).
set -eu

rounds=5
reps=11
threads=2
out=""
wait_idle=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --no-wait) wait_idle=0; shift ;;
        --) shift; break ;;
        *) echo "blas_compare.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=build/bench
mkdir -p "$bin" bench/results
date_tag=$(date +%Y-%m-%d)
[ -n "$out" ] || out="bench/results/blas_compare-$date_tag.txt"

OB_INC=/usr/include/x86_64-linux-gnu/openblas-openmp
OB_LIB=/usr/lib/x86_64-linux-gnu/openblas-openmp
BL_INC=/usr/include/x86_64-linux-gnu/blis-openmp
BL_LIB=/usr/lib/x86_64-linux-gnu/blis-openmp
for f in "$OB_INC/cblas.h" "$OB_LIB/libopenblas.so" "$BL_INC/blis.h" "$BL_LIB/libblis.so"; do
    [ -e "$f" ] || { echo "blas_compare.sh: $f missing: apt-get install libopenblas-openmp-dev libblis-openmp-dev" >&2; exit 1; }
done

CC=${CC:-cc}
CFLAGS="-O2 -march=native -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp"
$CC $CFLAGS -isystem "$OB_INC" bench/blas_compare.c -o "$bin/blas_compare_openblas" \
    -L"$OB_LIB" -Wl,-rpath,"$OB_LIB" -lopenblas -lm
$CC $CFLAGS -DBENCH_BLIS -isystem "$BL_INC" bench/blas_compare.c -o "$bin/blas_compare_blis" \
    -L"$BL_LIB" -Wl,-rpath,"$BL_LIB" -lblis -lm

# Threads: the OpenMP runtime and both BLAS read OMP_NUM_THREADS (BLIS falls back to it
# when BLIS_NUM_THREADS is unset; without either it runs single-threaded). Never bind.
unset OMP_PROC_BIND OMP_PLACES BLIS_NUM_THREADS OPENBLAS_NUM_THREADS GOTO_NUM_THREADS || true
export OMP_NUM_THREADS="$threads"

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT

quiet_name=blas_compare.sh; quiet_py=$(command -v python3)
. "$root/bench/quiet.sh"  # wait_quiet, clean_run: runs no other job disturbed

echo "blas_compare.sh: $rounds rounds x 2 libraries, $reps reps per shape, $threads threads" >&2
r=1
while [ "$r" -le "$rounds" ]; do
    # ABBA: alternate which library runs first, so drift hits both alike.
    if [ $((r % 2)) -eq 1 ]; then order="openblas blis"; else order="blis openblas"; fi
    for lib in $order; do
        clean_run "$raw/$lib.$r.tsv" "$bin/blas_compare_$lib" --tsv --reps "$reps" "$@"
        echo "  round $r $lib done" >&2
    done
    r=$((r + 1))
done

{
    echo "# blas_compare: SGEMM on the contractions of one BERT training step, OpenBLAS vs BLIS"
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine:  $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB)"
    echo "kernel:   $(uname -r)"
    echo "commit:   $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
    echo "compiler: $($CC --version | head -1)"
    echo "libraries:"
    dpkg -l libopenblas0-openmp libblis4-openmp libgomp1 2>/dev/null | awk '/^ii/{printf "  %s %s\n", $2, $3}'
    echo "settings: OMP_NUM_THREADS=$threads, OMP_PROC_BIND unset, $rounds rounds (ABBA), $reps timed reps per shape after 3 warm-up, extra args: ${*:-none}"
    echo "noise:    waited $waited s for an idle machine; $repeats runs repeated because other jobs used >5% of a CPU meanwhile; $noisy kept although disturbed (checks on: $wait_idle)"
    echo
    /usr/bin/env python3 - "$raw" "$rounds" <<'PY'
import glob, os, statistics, sys
raw, rounds = sys.argv[1], int(sys.argv[2])
data, meta = {}, {}   # data[lib][shape] = list of ms over rounds
calls, gflop, order = {}, {}, []
for lib in ("blis", "openblas"):  # BLIS first: its rows are a superset, in run order
    data[lib] = {}
    for r in range(1, rounds + 1):
        for line in open(os.path.join(raw, f"{lib}.{r}.tsv")):
            f = line.rstrip("\n").split("\t")
            if f[0] == "#lib":
                meta[lib] = " ".join(f[1:])
                continue
            shape = f[0]
            if shape not in calls:
                order.append(shape)
            calls[shape], gflop[shape] = int(f[1]), float(f[2])
            data[lib].setdefault(shape, []).append(float(f[3]))
for lib in ("openblas", "blis"):
    print(f"{lib}: {meta.get(lib, '?')}")
print()
med = lambda v: statistics.median(v)
def ratio(shape):  # median over rounds of the per-round time ratio BLIS/OpenBLAS
    a, b = data["openblas"].get(shape), data["blis"].get(shape)
    if not a or not b:
        return None
    return med([y / x for x, y in zip(a, b)])
hdr = f"{'contraction':42s} {'calls':>5s} {'GFLOP':>7s} | {'OpenBLAS ms':>11s} {'GF/s':>6s} | {'BLIS ms':>9s} {'GF/s':>6s} | {'BLIS/OB time':>12s}"
print(hdr)
print("-" * len(hdr))
for shape in order:
    g = gflop[shape]
    cells = []
    for lib in ("openblas", "blis"):
        v = data[lib].get(shape)
        if v:
            m = med(v)
            cells.append(f"{m:11.3f} {g / m * 1e3:6.1f}" if lib == "openblas" else f"{m:9.3f} {g / m * 1e3:6.1f}")
        else:
            cells.append(f"{'-':>11s} {'-':>6s}" if lib == "openblas" else f"{'-':>9s} {'-':>6s}")
    rt = ratio(shape)
    rts = f"{rt:12.3f}" if rt is not None else f"{'-':>12s}"
    if shape.startswith("total_linear"):
        print("-" * len(hdr))
    print(f"{shape:42s} {calls[shape]:5d} {g:7.3f} | {cells[0]} | {cells[1]} | {rts}")
print()
print("per round (ms):")
for shape in [s for s in order if s.startswith("total_")]:
    for lib in ("openblas", "blis"):
        v = data[lib].get(shape)
        if v:
            print(f"  {shape:32s} {lib:8s} " + " ".join(f"{x:7.2f}" for x in v))
print()
# One step's contractions: the 12 linear calls plus the best attention mode of each library.
for lib in ("openblas", "blis"):
    att = {s: med(v) for s, v in data[lib].items() if s.startswith("total_attention")}
    best = min(att, key=att.get)
    lin = med(data[lib]["total_linear"])
    print(f"one step, {lib:8s}: linear {lin:7.2f} ms + attention {att[best]:6.2f} ms ({best[16:-1]}) = {lin + att[best]:7.2f} ms")
PY
} | tee "$out"
rm -rf "$bin/blas_compare-raw" && mkdir -p "$bin/blas_compare-raw" && cp "$raw"/*.tsv "$bin/blas_compare-raw/"
echo "blas_compare.sh: wrote $out (raw per-run rows in $bin/blas_compare-raw/)" >&2
