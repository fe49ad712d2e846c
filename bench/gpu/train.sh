#!/bin/sh
# bench/gpu/train.sh: `dmove train --device cuda` on a GPU, in one call (estimated 3-5
# minutes on an H100 with prebuilt binaries, most of it torch.compile: COMPILE=0 or one size,
# SIZES=8x512, to be sure of a 10-minute limit; with COMPILE=0 about 1.5 minutes on an
# H100, 2026-11-24):
#   1. the trainer's tests on the device (tests/test_train, DMOVE_TEST_GPU=1: the stack
#      against PyTorch's reference, CPU vs GPU trainer in fp32 and bf16, checkpoints,
#      AdamW's kernel redone on the host); stops if they fail;
#   2. a stack of BERT-large layers (LAYERS, default 4; i=1024 h=16 u=4096, dropout 0.1)
#      trained on its teacher task in bf16 at b=8 j=512 and b=32 j=128: dmove train with
#      the interpreting row kernel and with --rows auto --streams 2, against PyTorch eager
#      and torch.compile (bench/gpu/train_gpu.py: autocast bf16, fp32 master weights,
#      AdamW(fused=True)), median step (forward, loss, backward, AdamW) on this GPU in this
#      run, with ratios against PyTorch eager.
# Usage: sh bench/gpu/train.sh [OUTDIR]
# Env: DMOVE, TEST_TRAIN (binaries; else built here), PYTHON (default python3, torch with
#      CUDA), LAYERS, SIZES (default "8x512 32x128"), STEPS (default 25), COMPILE=0 skips
#      torch.compile.
set -u
OUT=${1:-bench-gpu-train-out}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
LAYERS=${LAYERS:-4}
SIZES=${SIZES:-"8x512 32x128"}
STEPS=${STEPS:-25}
COMPILE=${COMPILE:-1}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/common.sh"
gpu_setup test_train
[ -n "$BUILT_TEST" ] && TEST_TRAIN=${TEST_TRAIN:-$BUILT_TEST}
unset DMOVE_CUDA_EMULATE
echo "dmove train on the GPU: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT"
echo "GPU: ${GPU:-unknown}; torch: $($PYTHON -c 'import torch; print(torch.__version__)' 2>/dev/null)"

if [ -n "${TEST_TRAIN:-}" ]; then
    echo
    echo "== the trainer's tests on the GPU ($TEST_TRAIN) =="
    # the references are read from tests/ref (the working tree's)
    if ! (cd "$root" && DMOVE_TEST_GPU=1 timeout 150 "$TEST_TRAIN") >"$OUT/test_train.txt" 2>&1; then
        grep -E "FAIL|error" "$OUT/test_train.txt" | head -30
        tail -3 "$OUT/test_train.txt"
        echo "the trainer's tests FAILED on the GPU: no benchmark"
        exit 1
    fi
    grep -E "CUDA backend|GPU|tests/" "$OUT/test_train.txt"
fi

for s in $SIZES; do
    b=${s%x*}
    j=${s#*x}
    tag="b${b}j${j}"
    cfg="--layers $LAYERS --batch $b --seq $j --hidden 1024 --heads 16 --ffn 4096"
    echo
    echo "== $LAYERS BERT-large layers, b=$b j=$j, bf16, $STEPS steps each =="
    : >"$OUT/train-$tag.jsonl"
    for rows in "interp 1" "auto 2"; do
        set -- $rows
        if timeout 120 "$DMOVE" train --device cuda --dtype bf16 --rows "$1" --streams "$2" $cfg --steps "$STEPS" \
            --json >"$OUT/dmove-$tag-$1.json" 2>"$OUT/dmove-$tag-$1.err"; then
            sed "s/^{/{\"framework\":\"dmove train (rows $1, streams $2)\",/" "$OUT/dmove-$tag-$1.json" >>"$OUT/train-$tag.jsonl"
        else
            echo "dmove train --rows $1 failed:"
            tail -3 "$OUT/dmove-$tag-$1.err"
        fi
    done
    for mode in eager compile; do
        [ "$mode" = compile ] && [ "$COMPILE" = 0 ] && continue
        timeout 150 $PYTHON "$here/train_gpu.py" --layers "$LAYERS" --batch "$b" --seq "$j" --mode "$mode" \
            --reps "$STEPS" >>"$OUT/train-$tag.jsonl" 2>"$OUT/torch-$tag-$mode.err" ||
            { echo "PyTorch $mode failed:"; tail -3 "$OUT/torch-$tag-$mode.err"; }
    done
    $PYTHON - "$OUT/train-$tag.jsonl" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    t = json.loads(line)
    if "step_ms_median" in t:  # dmove train --json
        rows.append((t["framework"] + f" ({t['gflop_per_s'] / 1e3:.0f} TFLOP/s)", t["step_ms_median"], t["loss"][-1],
                     (t["memory_bytes"]["arenas"] + t["memory_bytes"]["scratch"] + t["memory_bytes"]["optimizer"]) / 1e6))
    else:
        rows.append((t["framework"] + " (" + t["recipe"] + ")", t["step_ms"], t["loss"], t.get("peak_mb")))
eager = next((r[1] for r in rows if r[0].startswith("pytorch-eager")), None)
print(f"{'':64s} {'step ms':>9s} {'vs eager':>9s} {'last loss':>10s} {'memory MB':>10s}")
for name, ms, loss, mb in rows:
    ratio = f"{eager / ms:8.2f}x" if eager else "       -"
    print(f"{name:64s} {ms:9.2f} {ratio} {loss:10.4f} {mb if mb is not None else float('nan'):10.0f}")
print("(dmove: median step without its teacher and without sending the batch up, TFLOP/s of the layers' flop; memory = arenas + workspaces + AdamW's"
      " moments and master weights. PyTorch:"
      " fixed random inputs and targets, so its loss is not comparable; memory = peak allocated)")
PY
done
