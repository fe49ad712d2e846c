#!/bin/sh
# bench/peers/run_torch_vs_dmove.sh: one training step of one BERT encoder layer in PyTorch
# eager (Debian's python3-torch) beside dmove, interleaved in one run, several rounds;
# prints a table of medians and ratios against dmove's fused schedule and saves it, with
# machine, date and commit, to bench/results/torch_vs_dmove-<date>.txt.
#
# Usage: sh bench/peers/run_torch_vs_dmove.sh [--rounds N] [--reps R] [--warmup W]
#          [--batch B] [--seq J] [--hidden I] [--heads H] [--ffn U]
#          [--ablation] [--no-dmove] [--no-wait] [--pthread-blas DIR]
#          [--fetch-pthread-blas] [--out FILE]
# Defaults: BERT-base (b=8 j=128 i=768 h=12 u=3072), 3 rounds, 10 timed reps after 3
# warm-up per run.
#
# PyTorch variants (what each changes, for this process only):
#   as-installed   nothing: the BLAS the system's alternatives give, PyTorch's own thread
#                  count, glibc malloc defaults.
#   debian-default PyTorch with the pthread build of OpenBLAS, which `apt-get install
#                  python3-torch` pulls in on a fresh Debian (libopenblas0 ->
#                  libopenblas0-pthread); only where that build is found (--pthread-blas
#                  DIR, /usr/lib/x86_64-linux-gnu/openblas-pthread, or build/bench/
#                  openblas-pthread; `--fetch-pthread-blas` unpacks it there with
#                  apt-get download + dpkg -x, installing nothing).
#   debian-default+threads2  the same with torch.set_num_threads(2): PyTorch's OpenMP pool
#                  and OpenBLAS's pthread pool then spin against each other on two cores.
#                  (PyTorch 1.13 picks 1 thread by itself on this 2-vCPU KVM guest; where it
#                  detects both cores, this is what "as installed" means.)
#   fixed          the OpenMP build of OpenBLAS (LD_LIBRARY_PATH to its directory, which
#                  holds libblas.so.3, liblapack.so.3 and libopenblas.so.0, all that
#                  libtorch_cpu.so needs), torch.set_num_threads(2) so that PyTorch's
#                  OpenMP pool and the BLAS are one pool of both cores, and glibc malloc
#                  kept from mmap/munmap and trimming (MALLOC_* below), so that a step
#                  reuses heap pages instead of page-faulting fresh ones.
#   --ablation adds each fix alone and in pairs, to show what each one is worth.
# dmove: build/dmove bench --json (both schedules in one run, interleaved rep by rep by
# dmove itself; same --reps/--warmup), rows dmove-fused and dmove-unfused; skipped if
# build/dmove is missing or fails (build it with `make`).
# Each run waits for an idle machine and is repeated (up to 4 tries) when other jobs used
# more than 5% of a CPU while it ran; --no-wait turns both off.
set -eu

rounds=3; reps=10; warmup=3
batch=8; seq=128; hidden=768; heads=12; ffn=3072
ablation=0; run_dmove=1; wait_idle=1; fetch=0; pthread_dir=""; out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --batch) batch="$2"; shift 2 ;;
        --seq) seq="$2"; shift 2 ;;
        --hidden) hidden="$2"; shift 2 ;;
        --heads) heads="$2"; shift 2 ;;
        --ffn) ffn="$2"; shift 2 ;;
        --ablation) ablation=1; shift ;;
        --no-dmove) run_dmove=0; shift ;;
        --no-wait) wait_idle=0; shift ;;
        --pthread-blas) pthread_dir="$2"; shift 2 ;;
        --fetch-pthread-blas) fetch=1; shift ;;
        --out) out="$2"; shift 2 ;;
        *) echo "run_torch_vs_dmove.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mkdir -p bench/results build/bench
[ -n "$out" ] || out="bench/results/torch_vs_dmove-$(date +%Y-%m-%d).txt"
PY=/usr/bin/python3   # Debian's python, where python3-torch lives (not a pyenv one on PATH)
"$PY" -c "import torch" 2>/dev/null || { echo "run_torch_vs_dmove.sh: $PY cannot import torch: apt-get install python3-torch" >&2; exit 1; }

OMP_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
[ -e "$OMP_DIR/libblas.so.3" ] || { echo "run_torch_vs_dmove.sh: $OMP_DIR missing: apt-get install libopenblas0-openmp" >&2; exit 1; }
if [ "$fetch" -eq 1 ] && [ ! -e build/bench/openblas-pthread/libblas.so.3 ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libopenblas0-pthread >/dev/null && dpkg -x libopenblas0-pthread_*.deb x)
    mkdir -p build/bench/openblas-pthread
    cp -P "$tmp"/x/usr/lib/x86_64-linux-gnu/openblas-pthread/* build/bench/openblas-pthread/
    rm -rf "$tmp"
fi
if [ -z "$pthread_dir" ]; then
    for d in /usr/lib/x86_64-linux-gnu/openblas-pthread "$root/build/bench/openblas-pthread"; do
        [ -e "$d/libblas.so.3" ] && { pthread_dir="$d"; break; }
    done
fi

# glibc malloc without mmap: every allocation from the heap (no mmap/munmap per tensor),
# freed memory kept (no trim back to the kernel), heap grown in 256 MiB steps.
MALLOC_FIX="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456"
OMP_BLAS="LD_LIBRARY_PATH=$OMP_DIR"

# name|threads (0 = PyTorch default)|environment
variants="as-installed|0|"
[ -n "$pthread_dir" ] && variants="$variants
debian-default|0|LD_LIBRARY_PATH=$pthread_dir
debian-default+threads2|2|LD_LIBRARY_PATH=$pthread_dir"
variants="$variants
fixed|2|$OMP_BLAS $MALLOC_FIX"
if [ "$ablation" -eq 1 ]; then
    variants="$variants
omp-blas|0|$OMP_BLAS
omp-blas+threads2|2|$OMP_BLAS
omp-blas+malloc|0|$OMP_BLAS $MALLOC_FIX
omp-blas+threads2+mmap-threshold-only|2|$OMP_BLAS MALLOC_MMAP_THRESHOLD_=33554432"
    [ -n "$pthread_dir" ] && variants="$variants
pthread-blas+malloc|0|LD_LIBRARY_PATH=$pthread_dir $MALLOC_FIX
pthread-blas+threads2+malloc|2|LD_LIBRARY_PATH=$pthread_dir $MALLOC_FIX"
fi

dmove_ok=0
if [ "$run_dmove" -eq 1 ]; then
    if [ -x build/dmove ] && build/dmove bench --json --schedule fused --batch 1 --seq 8 --hidden 16 --heads 2 --ffn 32 >/dev/null 2>&1; then
        dmove_ok=1
        variants="$variants
dmove|-|both"
    else
        echo "run_torch_vs_dmove.sh: build/dmove missing or 'dmove bench --json' failed: PyTorch only (run make first)" >&2
    fi
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT

quiet_name=run_torch_vs_dmove.sh; quiet_py=$PY
. "$root/bench/quiet.sh"  # wait_quiet, clean_run: runs no other job disturbed

nvar=$(printf '%s\n' "$variants" | wc -l)
sizes="--batch $batch --seq $seq --hidden $hidden --heads $heads --ffn $ffn"
echo "run_torch_vs_dmove.sh: $rounds rounds x $nvar variants, b=$batch j=$seq i=$hidden h=$heads u=$ffn" >&2
r=1
while [ "$r" -le "$rounds" ]; do
    # Rotate the order every round so that no variant always runs first or last.
    printf '%s\n' "$variants" | awk -v r="$r" -v n="$nvar" '{a[NR-1]=$0} END{for(k=0;k<n;k++) print a[(k+r-1)%n]}' > "$raw/order"
    while IFS='|' read -r name threads envs; do
        case "$name" in
        dmove)
            set -- env -u OMP_PROC_BIND -u LD_LIBRARY_PATH build/dmove bench --json $sizes \
                --reps "$reps" --warmup "$warmup" ;;
        *)
            # shellcheck disable=SC2086
            set -- env -u OMP_PROC_BIND -u OMP_NUM_THREADS -u LD_LIBRARY_PATH -u LD_PRELOAD \
                -u MALLOC_MMAP_MAX_ -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ -u MALLOC_TOP_PAD_ \
                $envs "$PY" bench/peers/torch_step.py $sizes --reps "$reps" --warmup "$warmup" \
                --threads "$threads" --variant "$name" ;;
        esac
        if clean_run "$raw/out" "$@" && [ -s "$raw/out" ]; then
            printf '%s\t%s\t%s\n' "$r" "$name" "$(tr -d '\n\t' < "$raw/out")" >> "$raw/all"
            echo "  round $r $name done" >&2
        else
            echo "  round $r $name failed" >&2
        fi
    done < "$raw/order"
    r=$((r + 1))
done

{
    echo "# torch_vs_dmove: one BERT encoder layer training step (forward + backward), fp32, CPU"
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine:  $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB), kernel $(uname -r)"
    echo "commit:   $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
    echo "config:   b=$batch j=$seq i=$hidden h=$heads u=$ffn; PyTorch: $reps timed reps after $warmup warm-up per run; $rounds rounds, order rotated each round"
    echo "packages: $(dpkg -l python3-torch libopenblas0-openmp libopenblas0-pthread libc6 2>/dev/null | awk '/^ii/{printf "%s %s, ", $2, $3}')"
    echo "noise:    waited $waited s for an idle machine; $repeats runs repeated because other jobs used >5% of a CPU meanwhile; $noisy kept although disturbed (checks on: $wait_idle)"
    echo "variants:"
    printf '%s\n' "$variants" | awk -F'|' '{printf "  %-40s threads=%s %s\n", $1, ($2 == "0" ? "default" : $2), $3}'
    echo
    "$PY" - "$raw/all" <<'PY'
import json, statistics, sys
rows = {}     # name -> round -> dict
order = []
for line in open(sys.argv[1]):
    r, name, js = line.rstrip("\n").split("\t", 2)
    try:
        d = json.loads(js)
    except ValueError:
        continue
    ents = [(name, d)]
    if name == "dmove":
        ents = [("dmove-" + e.get("schedule", "?"), e) for e in d.get("schedules", [])]
    for n, e in ents:
        if n not in order:
            order.append(n)
        rows.setdefault(n, {})[int(r)] = e
med = statistics.median
def col(name, key):
    v = [d[key] for d in rows[name].values() if isinstance(d.get(key), (int, float))]
    return med(v) if v else None
def ratio(name, base, key="step_ms"):  # median over rounds of per-round ratios
    if base not in rows:
        return None
    v = [rows[name][r][key] / rows[base][r][key] for r in rows[name]
         if r in rows[base] and rows[base][r].get(key) and rows[name][r].get(key)]
    return med(v) if v else None
fmt = lambda x, w=9, p=1: (f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}s}")
print(f"{'variant':40s} {'forward':>9s} {'backward':>9s} {'step':>9s} {'min':>9s} {'faults':>8s} {'/dmove':>7s} {'/fixed':>7s}  (ms, medians over rounds)")
for name in order:
    f, b, s = col(name, "forward_ms"), col(name, "backward_ms"), col(name, "step_ms")
    mn = min((d.get("step_min_ms", d.get("step_ms")) for d in rows[name].values()), default=None)
    pf = col(name, "page_faults_per_step")
    print(f"{name:40s} {fmt(f)} {fmt(b)} {fmt(s)} {fmt(mn)} {fmt(pf, 8, 0)} {fmt(ratio(name, 'dmove-fused'), 7, 2)} {fmt(ratio(name, 'fixed'), 7, 2)}")
print()
for name in ("dmove-fused", "dmove-unfused"):
    if name in rows:
        c = col(name, "contractions_alone_ms")
        s = col(name, "step_ms")
        if c:
            print(f"{name}: step {s:.1f} ms, contractions alone {c:.1f} ms, step/contractions {s / c:.3f} (bar: <= 1.2)")
        cls = {}
        for d in rows[name].values():
            for k, v in (d.get("class_ms") or {}).items():
                cls.setdefault(k, []).append(v)
        if cls:
            print("  class_ms: " + ", ".join(f"{k} {med(v):.1f}" for k, v in cls.items()))
for name in order:
    if not name.startswith("dmove-"):
        s = next(iter(rows[name].values())).get("settings", "")
        print(f"settings {name}: {s}")
PY
    echo
    echo "raw (round, variant, JSON):"
    cat "$raw/all"
} | tee "$out"
echo "run_torch_vs_dmove.sh: wrote $out" >&2
