#!/bin/sh
# dist_cpu.sh: what summing the gradients over ranks costs on this machine. The same
# global batch three ways, interleaved round by round: one process with 2 threads; 2
# ranks (mpirun -np 2) of 1 thread each, half the batch each; the same with --zero 1.
# `dmove train` (the encoder stack on the teacher task) and `dmove pretrain` (a whole
# small BERT on a generated corpus), each step's median (the teacher's forward and the
# data not counted), and the reductions' busy and exposed time per step.
# Usage: sh bench/dist_cpu.sh [--rounds R] [--no-wait] [--out FILE]   (DMOVE=build/dmove)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
rounds=3; wait_idle=1; out=""
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --no-wait) wait_idle=0; shift ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "dist_cpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
DMOVE=${DMOVE:-$root/build/dmove}
[ -x "$DMOVE" ] || { echo "dist_cpu.sh: no $DMOVE: run make first" >&2; exit 1; }
"$DMOVE" --version | grep -q 'data parallelism: MPI' ||
    { echo "dist_cpu.sh: $DMOVE was built without MPI (apt-get install libopenmpi-dev openmpi-bin; make)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
quiet_name=dist_cpu.sh; quiet_py=python3
. "$root/bench/quiet.sh"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
[ -n "$out" ] && exec >"$out"

# a corpus for pretrain: 3000 lines of a small vocabulary
{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in the a quick brown fox jumps over lazy dog cat sat on mat hello world and then it was is in of to \
             run ran home . , '!' big small red blue green tree house car road river; do echo "$w"; done
} >"$tmp/vocab.txt"
awk 'BEGIN { srand(7); split("the a quick brown fox jumps over lazy dog cat sat on mat hello world and then it was is in of to run ran home big small red blue green tree house car road river", w, " ");
    for (l = 0; l < 3000; l++) { n = 8 + int(rand() * 20); s = ""; for (k = 0; k < n; k++) s = s w[1 + int(rand() * 37)] " "; print s "."; if (l % 10 == 9) print "" } }' >"$tmp/corpus.txt"
"$DMOVE" prepare --tokenizer "$tmp/vocab.txt" --lowercase --out "$tmp/data" "$tmp/corpus.txt" >/dev/null ||
    { echo "dist_cpu.sh: prepare failed" >&2; exit 1; }

TRAIN="train --layers 2 --seq 128 --steps 8 --dropout 0 --json"          # BERT-base layers (the preset)
PRE="pretrain --data $tmp/data --tokenizer $tmp/vocab.txt --lowercase --layers 4 --hidden 256 --heads 4 --ffn 1024 \
--seq 128 --steps 8 --dropout 0 --eval-every 1000 --json"
num() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
# (the runs' progress, on stderr with --json, is dropped: sh -c 'exec "$@" 2>/dev/null')
reduce_of() { sed -n 's/.*"reduce_ms":{"busy":\([0-9.]*\),"exposed":\([0-9.]*\)}.*/\1 \2/p' "$1"; }

echo "dist_cpu.sh: $(date -u +%Y-%m-%d), dmove $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (and changes not committed)'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(grep -o -m1 'avx512f' /proc/cpuinfo || echo 'no AVX-512')"
echo "$("$DMOVE" --version | tail -1)"
for job in train pretrain; do
    if [ $job = train ]; then C=$TRAIN; G=8; else C=$PRE; G=16; fi
    : >"$tmp/$job.alone"; : >"$tmp/$job.two"; : >"$tmp/$job.zero"
    r=1
    while [ $r -le "$rounds" ]; do
        # shellcheck disable=SC2086
        clean_run "$tmp/o1" sh -c 'exec "$@" 2>/dev/null' sh "$DMOVE" $C --batch $G --threads 2 || { echo "alone failed" >&2; exit 1; }
        num "$tmp/o1" step_ms_median >>"$tmp/$job.alone"
        # shellcheck disable=SC2086
        clean_run "$tmp/o2" sh -c 'exec "$@" 2>/dev/null' sh mpirun -np 2 --bind-to core "$DMOVE" $C --batch $((G / 2)) --threads 1 || exit 1
        echo "$(num "$tmp/o2" step_ms_median) $(reduce_of "$tmp/o2")" >>"$tmp/$job.two"
        # shellcheck disable=SC2086
        clean_run "$tmp/o3" sh -c 'exec "$@" 2>/dev/null' sh mpirun -np 2 --bind-to core "$DMOVE" $C --batch $((G / 2)) --threads 1 --zero 1 || exit 1
        echo "$(num "$tmp/o3" step_ms_median) $(reduce_of "$tmp/o3")" >>"$tmp/$job.zero"
        r=$((r + 1))
    done
    med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
    a=$(cut -d' ' -f1 "$tmp/$job.alone" | med)
    t=$(cut -d' ' -f1 "$tmp/$job.two" | med); tb=$(cut -d' ' -f2 "$tmp/$job.two" | med); te=$(cut -d' ' -f3 "$tmp/$job.two" | med)
    z=$(cut -d' ' -f1 "$tmp/$job.zero" | med); zb=$(cut -d' ' -f2 "$tmp/$job.zero" | med); ze=$(cut -d' ' -f3 "$tmp/$job.zero" | med)
    echo
    if [ $job = train ]; then
        echo "dmove train: 2 BERT-base layers (i=768), global batch b=$G j=128, medians of $rounds rounds (ms per step)"
    else
        echo "dmove pretrain: a BERT of 4 layers (i=256, vocabulary $(wc -l <"$tmp/vocab.txt")), global batch b=$G j=128, medians of $rounds rounds"
    fi
    printf '  %-34s %9s %9s %14s %14s\n' "" "step ms" "vs alone" "sums busy ms" "sums exposed ms"
    printf '  %-34s %9.1f %9s %14s %14s\n' "1 process x 2 threads" "$a" "1.00" "-" "-"
    printf '  %-34s %9.1f %9.2f %14.1f %14.1f\n' "2 ranks x 1 thread" "$t" "$(echo "$t $a" | awk '{print $1/$2}')" "$tb" "$te"
    printf '  %-34s %9.1f %9.2f %14.1f %14.1f\n' "2 ranks x 1 thread, --zero 1" "$z" "$(echo "$z $a" | awk '{print $1/$2}')" "$zb" "$ze"
done
echo
echo "(noise: waited $waited s for an idle machine, $repeats runs repeated, $noisy kept disturbed)"
