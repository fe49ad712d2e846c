#!/bin/sh
# bench/pretrain_race.sh: issue 24's point 6. Pretrains the same small BERT from scratch on
# a real corpus for a fixed wall time in each system, one after the other on this CPU:
# dmove (`dmove pretrain`), transformers' BertForMaskedLM eager and torch.compile (with
# labels, as a user runs it), and, with --systems, the variants that gather the scored
# positions before the head. The same model config (4 layers, i=256, h=4, u=1024, j=128,
# b=16, dropout 0.1; bert-base-uncased's vocabulary, 30522 tokens), the same batches (dmove's
# loader: packed sentences, 15% masked 80/10/10, seed 0; the torch side reads them through
# bench/dump_batches.c), the same held-out batches (the valid split, E=8 batches every K=50
# steps by default), optimizer (AdamW lr 5e-4, 100 warm-up steps then constant, wd 0.01, clip 1) and
# seed. The clock is training time: the evaluations are not counted (bench/pretrain_race.py).
#
# The corpus: the English parts of the repository's Debian text (tests/text/corpus:
# debian-reference, man-rendered, man-latin, dictionaries; tests/text/SOURCES says which
# packages), 5.7 MB, 2.0 M tokens, or --corpus FILE (e.g. a larger Debian text package's).
#
# Writes bench/results/pretrain-race-<date>[-LABEL]/: <system>.json (the held-out points:
# training seconds, step, loss, accuracy; a sample of the training loss), curves.csv,
# heldout-loss.svg (held-out loss against training time, one line per system) and
# summary.txt (machine, date, commit, the settings, the last held-out point of each).
#
# Usage: sh bench/pretrain_race.sh [MINUTES] [--label L] [--systems "dmove torch-eager ..."]
#                                  [--corpus FILE] [--eval-every K] [--eval-batches E]
#   MINUTES: each system's training time (default 20); K (default 50) and E (default 8).
#   A smoke test: sh bench/pretrain_race.sh 2 --label smoke --eval-every 5 --eval-batches 2
# Needs: a CPU build (DMOVE=build-cpu/dmove by default, and its libdmove.a), python3 with
# torch and transformers (PY=...).
set -eu
minutes=20; label=""; systems="dmove torch-eager torch-compile"; corpus=""; every=50; evb=8
while [ $# -gt 0 ]; do
    case "$1" in
        --label) label="-$2"; shift 2 ;;
        --systems) systems="$2"; shift 2 ;;
        --corpus) corpus="$2"; shift 2 ;;
        --eval-every) every="$2"; shift 2 ;;
        --eval-batches) evb="$2"; shift 2 ;;
        -*) echo "pretrain_race.sh: unknown option $1" >&2; exit 2 ;;
        *) minutes="$1"; shift ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
DMOVE=${DMOVE:-$root/build-cpu/dmove}
PY=${PY:-python3}
[ -x "$DMOVE" ] || { echo "no $DMOVE: make CUDA=0 BUILD=build-cpu build-cpu/dmove (or DMOVE=...)" >&2; exit 1; }
tok=$root/tests/text/tok/bert-base-uncased.json
out=$root/bench/results/pretrain-race-$(date -u +%Y-%m-%d)$label
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "$corpus" ]; then
    cp "$corpus" "$tmp/corpus.txt"
else
    for f in debian-reference man-rendered man-latin dictionaries; do gzip -dc "$root/tests/text/corpus/$f.txt.gz"; done >"$tmp/corpus.txt"
fi
"$DMOVE" prepare --tokenizer "$tok" --out "$tmp/data" --valid-fraction 0.05 "$tmp/corpus.txt" | tee "$tmp/prepare.txt" >&2
cc -O2 -I"$root/include" "$root/bench/dump_batches.c" "$(dirname "$DMOVE")/libdmove.a" -o "$tmp/dump_batches" -fopenmp \
    $(pkg-config --libs openblas) -lcjson -lm
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
files=""
for s in $systems; do
    echo "== $s: $minutes minutes ($(date -u +%H:%M:%S))" >&2
    "$PY" "$here/pretrain_race.py" run --system "$s" --minutes "$minutes" --out "$out/$s.json" --data "$tmp/data" \
        --tokenizer "$tok" --dmove "$DMOVE" --dumper "$tmp/dump_batches" --eval-every "$every" --eval-batches "$evb"
    files="$files $out/$s.json"
done
# shellcheck disable=SC2086
"$PY" "$here/pretrain_race.py" chart --out "$out" --title "pretraining race, $minutes min each$([ -z "$label" ] || echo " ($label)")" $files
commit="$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (dirty tree)')"
{
    echo "# bench/pretrain_race.sh $minutes${label:+ --label ${label#-}}: pretraining a small BERT from scratch, $minutes minutes of training time each"
    [ -z "$label" ] || echo "# ${label#-}: a short test of the script, not the race's result"
    echo "started: $start; ended $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) CPUs), 2 threads each; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "commit:  $commit"
    echo "model:   BertForMaskedLM, 4 layers, i=256 h=4 u=1024, 512 positions, 2 types, vocabulary 30522 (bert-base-uncased), dropout 0.1"
    echo "data:    $([ -n "$corpus" ] && echo "$corpus" || echo "tests/text/corpus: debian-reference, man-rendered, man-latin, dictionaries (tests/text/SOURCES)"); b=16 j=128 packed, 15% masked (80/10/10), seed 0, dmove's loader for all"
    sed 's/^/         /' "$tmp/prepare.txt" | head -3
    echo "train:   AdamW lr 5e-4 (100 warm-up steps, then constant), betas 0.9/0.999, eps 1e-6, wd 0.01, clip 1; the first (b*j+4)/5 = 410 chosen positions of a batch scored"
    echo "eval:    every $every steps, $evb held-out batches (valid split), no dropout; clock = training time, evaluations excluded"
    echo
    "$PY" - $files <<'PYEOF'
import json, sys
print(f"{'system':22s} {'steps':>7s} {'steps/s':>8s} {'held-out loss':>14s} {'accuracy':>9s}  (last evaluation; then the loss at 1/4, 1/2, 3/4 of the time)")
for f in sys.argv[1:]:
    x = json.load(open(f))
    e = x["eval"]
    T = x["minutes"] * 60
    def at(frac):
        p = [q for q in e if q["t"] <= frac * T]
        return f"{p[-1]['loss']:.3f}" if p else "-"
    last = e[-1] if e else {"loss": float("nan"), "accuracy": float("nan")}
    print(f"{x['system']:22s} {x['steps']:7d} {x['steps'] / T:8.2f} {last['loss']:14.4f} {last['accuracy']:9.3f}  "
          + " ".join(at(fr) for fr in (0.25, 0.5, 0.75)) + f"   ({x['how']})")
PYEOF
} | tee "$out/summary.txt"
echo "saved to $out" >&2
