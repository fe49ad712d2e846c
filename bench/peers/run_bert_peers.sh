#!/bin/sh
# bench/peers/run_bert_peers.sh: the whole BERT's masked-LM training step (embeddings, the
# encoder layers, the MLM head, cross-entropy, clipping at 1, AdamW) of `dmove pretrain`
# against transformers' BertForMaskedLM (bench/peers/bert_mlm_step.py) on the same batches
# (dmove's loader: packed sentences, 15% chosen, the same scored positions), BERT-base,
# j=128, fp32, dropout 0.1, 2 threads, CPU; interleaved over rounds in one run (the order
# rotated each round); medians and ratios against dmove, saved with machine, date and
# commit to bench/results/bert-peers-<date>.txt.
#
# Variants: dmove (`dmove pretrain --json`: the median of its steps' wall time, data wait
# included, evaluation not); torch-eager-full and torch-compile-full (BertForMaskedLM with
# labels, as a user runs it: the head and logits at all b*j positions); torch-eager-gather
# and torch-compile-gather (the encoder's output gathered at the scored positions before
# the head, as dmove does). Each torch run times AdamW foreach and fused, and keeps the
# faster (its JSON says which). --profile: after the rounds, one profiled step of each
# eager variant at the first batch size (torch.profiler's top ops by self CPU time), and
# dmove's phase times from its JSON. --rounds: one number, or one for each batch size
# (the last repeated), e.g. --rounds "2 1".
#
# Usage: sh bench/peers/run_bert_peers.sh [--batches "8 32"] [--rounds "N ..."] [--reps R]
#                                         [--warmup W] [--layers L] [--profile]
#                                         [--adamw both|fused|foreach] [--label L]
# (--adamw: the torch runs time only that AdamW, to save time on a busy machine; --label:
# bert-peers-<date>-L.txt)
# Needs: a CPU build (DMOVE=build-cpu/dmove by default; its libdmove.a builds the batch
# dumper), python3 with torch and transformers (PY=...).
set -eu
batches="8 32"; rounds=2; reps=3; warmup=2; layers=12; profile=0; adamw=both; label=""
while [ $# -gt 0 ]; do
    case "$1" in
        --batches) batches="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --layers) layers="$2"; shift 2 ;;
        --profile) profile=1; shift ;;
        --adamw) adamw="$2"; shift 2 ;;
        --label) label="-$2"; shift 2 ;;
        *) echo "run_bert_peers.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
DMOVE=${DMOVE:-$root/build-cpu/dmove}
PY=${PY:-python3}
[ -x "$DMOVE" ] || { echo "no $DMOVE: make CUDA=0 BUILD=build-cpu build-cpu/dmove (or DMOVE=...)" >&2; exit 1; }
lib=$(dirname "$DMOVE")/libdmove.a
tok=$root/tests/text/tok/bert-base-uncased.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$root/bench/results/bert-peers-$(date -u +%Y-%m-%d)$([ "$layers" = 12 ] || echo "-L$layers")$label.txt
raw=$tmp/raw
: >"$raw"
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456

# the data: the English parts of the repository's Debian corpus (tests/text/SOURCES), bert-base-uncased
for f in debian-reference man-rendered man-latin dictionaries; do gzip -dc "$root/tests/text/corpus/$f.txt.gz"; done >"$tmp/corpus.txt"
"$DMOVE" prepare --tokenizer "$tok" --out "$tmp/data" --valid-fraction 0.05 "$tmp/corpus.txt" >/dev/null
cc -O2 -I"$root/include" "$root/bench/dump_batches.c" "$lib" -o "$tmp/dump_batches" -fopenmp \
    $(pkg-config --libs openblas) -lcjson -lm
steps=$((warmup + reps))
for b in $batches; do
    "$tmp/dump_batches" "$tmp/data" "$tok" train 0 "$b" 128 0 $((steps + 2)) "$tmp/b$b.bin"
done

run() { # round batch variant
    case $3 in
        dmove) j=$("$DMOVE" pretrain --data "$tmp/data" --tokenizer "$tok" --layers "$layers" --batch "$2" --seq 128 \
                   --steps "$steps" --threads 2 --eval-batches 1 --eval-every "$steps" --json 2>/dev/null) ;;
        *) v=${3#torch-}
           j=$("$PY" "$here/bert_mlm_step.py" --batches "$tmp/b$2.bin" --layers "$layers" --reps "$reps" \
                   --warmup "$warmup" --mode "${v%-*}" --head "${v#*-}" --adamw "$adamw" --predictions $(($2 * ((128 + 4) / 5)))) ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$j" >>"$raw"
}

rl=$rounds
for b in $batches; do
    variants="dmove torch-eager-full torch-eager-gather torch-compile-full torch-compile-gather"
    nr=${rl%% *}; [ "$rl" = "${rl#* }" ] || rl=${rl#* }
    r=1
    while [ "$r" -le "$nr" ]; do
        for v in $variants; do
            echo "b=$b round $r/$nr: $v ($(date -u +%H:%M:%S))" >&2
            run "$r" "$b" "$v"
        done
        variants="$(echo "$variants" | cut -d' ' -f2-) $(echo "$variants" | cut -d' ' -f1)"
        r=$((r + 1))
    done
done
if [ "$profile" = 1 ]; then
    b=${batches%% *}
    for h in full gather; do
        echo "profile: torch-eager-$h b=$b" >&2
        echo "== torch.profiler, torch-eager-$h, b=$b, one step (fused AdamW), top ops by self CPU time" >>"$tmp/prof"
        "$PY" "$here/bert_mlm_step.py" --batches "$tmp/b$b.bin" --layers "$layers" --reps 1 --warmup 1 --adamw fused \
            --mode eager --head "$h" --predictions $((b * ((128 + 4) / 5))) --profile 1 2>>"$tmp/prof" >/dev/null
    done
fi
commit="$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (dirty tree)')"
{
    echo "# peers: the whole BERT's MLM training step, BERT-base ($layers layers, i=768 h=12 u=3072, vocabulary 30522),"
    echo "# j=128, fp32, dropout 0.1, clip 1, AdamW (wd 0.01 on weights), 2 threads, CPU; the same batches (dmove's loader)"
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) CPUs), load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "commit:  $commit"
    echo "rounds:  $rounds (by batch size: $batches), order rotated each round; each run: $reps timed steps after $warmup warm-up ones (dmove: the"
    if [ "$adamw" = both ]; then
        echo "         median of its $steps steps' wall time, first included; torch: foreach AdamW for $warmup + $reps steps, then"
        echo "         fused for 1 + $reps, the faster median kept)"
    else
        echo "         median of its $steps steps' wall time, first included; torch: $adamw AdamW only)"
    fi
    echo
    "$PY" - "$raw" <<'PYEOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, b, v, j = line.rstrip("\n").split("\t", 3)
    rows.setdefault(int(b), {}).setdefault(v, []).append(json.loads(j))
for b, vs in rows.items():
    base = statistics.median(d["step_ms_median"] for d in vs["dmove"])
    print(f"b={b} j=128")
    print(f"  {'variant':22s} {'step ms':>9s} {'/dmove':>7s} {'seq/s':>7s}  AdamW    rounds (ms)")
    for v, ds in vs.items():
        t = [d["step_ms_median"] if v == "dmove" else d["step_ms"] for d in ds]
        m = statistics.median(t)
        opt = "-" if v == "dmove" else "/".join(sorted({d["adamw"] for d in ds}))
        print(f"  {v:22s} {m:9.1f} {m / base:7.2f} {b * 1e3 / m:7.2f}  {opt:8s} " + " ".join(f"{x:.1f}" for x in t))
    ph = vs["dmove"][0]["ms_per_step"]
    print("  dmove's phases (round 1, ms a step, mean over its steps): "
          + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()))
    for v, ds in vs.items():
        if v != "dmove":
            print(f"  {v}: " + " / ".join(k + " " + " ".join(str(d.get("step_ms_" + k, "-")) for d in ds)
                                          for k in ("foreach", "fused")) + " (ms, by round)")
    print()
PYEOF
    echo "raw (round, batch, variant, JSON):"
    cat "$raw"
    [ ! -f "$tmp/prof" ] || { echo; cat "$tmp/prof"; }
} | tee "$out"
echo "saved to $out" >&2
