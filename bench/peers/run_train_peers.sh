#!/bin/sh
# bench/peers/run_train_peers.sh: the training step of a stack of BERT encoder layers
# (forward, masked MSE loss, backward, AdamW) in PyTorch (eager with the default and the
# fused AdamW, torch.compile with the fused AdamW; bench/peers/train_stack.py) and in dmove
# (`dmove train --json`: its median step, the teacher's data excluded as the peers' fixed
# inputs are), interleaved over rounds in one run; prints medians and ratios against dmove
# and saves them with machine, date and commit to bench/results/train-peers-<date>.txt
# (train-peers-<date>-L<layers>.txt for other than 2 layers).
# Usage: sh bench/peers/run_train_peers.sh [--rounds N] [--layers L] [--reps R] [--norm pre] [--causal]
# (--norm pre / --causal: dmove's layer variants, against PyTorch's nn.TransformerEncoderLayer;
# the file name gets -pre / -causal)
# Sizes: BERT-base layers, b=8 j=128, 2 threads, dropout 0.1. Needs bench/.venv-peers
# (bench/peers/setup_venv.sh) and build/dmove (or DMOVE=...).
set -eu
rounds=3; layers=2; reps=10; vopt=""; vtag=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --layers) layers="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --norm) [ "$2" = pre ] || [ "$2" = post ] || { echo "run_train_peers.sh: --norm pre or post" >&2; exit 2; }
                [ "$2" = post ] || { vopt="$vopt --norm pre"; vtag="$vtag-pre"; }; shift 2 ;;
        --causal) vopt="$vopt --causal"; vtag="$vtag-causal"; shift ;;
        *) echo "run_train_peers.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
DMOVE=${DMOVE:-$root/build/dmove}
PY=${VENV:-$root/bench/.venv-peers}/bin/python
[ -x "$PY" ] || { echo "no $PY: run sh bench/peers/setup_venv.sh first" >&2; exit 1; }
out=$root/bench/results/train-peers-$(date -u +%Y-%m-%d)$([ "$layers" = 2 ] || echo "-L$layers")$vtag.txt
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456
variants="dmove torch-eager torch-eager-fused torch-compile"
r=1
while [ $r -le "$rounds" ]; do
    for v in $variants; do
        echo "round $r/$rounds: $v" >&2
        case $v in
            # shellcheck disable=SC2086
            dmove) j=$("$DMOVE" train --layers "$layers" --steps $((reps + 3)) --threads 2 --json $vopt 2>/dev/null)
                   echo "$r	dmove	$j" >>"$raw" ;;
            # shellcheck disable=SC2086
            *) j=$("$PY" "$here/train_stack.py" --layers "$layers" --reps "$reps" --mode "${v#torch-}" $vopt)
               echo "$r	$v	$j" >>"$raw" ;;
        esac
    done
    variants="$(echo "$variants" | cut -d' ' -f2-) $(echo "$variants" | cut -d' ' -f1)"
    r=$((r + 1))
done
# the commit before the results file (tracked) is rewritten by tee below
commit="$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (dirty tree)')"
{
    echo "# peers: training steps of $layers BERT-base encoder layers (b=8 j=128 i=768 h=12 u=3072), fp32, dropout 0.1,"
    echo "# forward + masked MSE + backward + AdamW (weight decay 0.01 on weights), 2 threads, CPU${vopt:+; dmove and train_stack.py with$vopt}"
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) CPUs)"
    echo "commit:  $commit"
    echo "rounds:  $rounds, order rotated each round; each run: $reps timed steps after 3 warm-up steps (dmove: the"
    echo "         median of its $((reps + 3)) steps' dm_trainer_step, first included)"
    echo
    "$PY" - "$raw" <<'PYEOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, v, j = line.rstrip("\n").split("\t", 2)
    d = json.loads(j)
    rows.setdefault(v, []).append(d["step_ms_median"] if v == "dmove" else d["step_ms"])
base = statistics.median(rows["dmove"])
print(f"{'variant':22s} {'step ms':>9s} {'/dmove':>7s}   (median over rounds of each run's median; rounds: ...)")
for v, t in rows.items():
    m = statistics.median(t)
    print(f"{v:22s} {m:9.1f} {m / base:7.2f}   " + " ".join(f"{x:.1f}" for x in t))
PYEOF
    echo
    echo "raw (round, variant, JSON):"
    cat "$raw"
} | tee "$out"
echo "saved to $out" >&2
