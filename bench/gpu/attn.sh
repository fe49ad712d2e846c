#!/bin/sh
# bench/gpu/attn.sh: issue 25's point 2 on a GPU: attention alone, forward and backward,
# BERT-large's heads (h=16, d=64), bf16, dropout 0.1, at b=8 j=512 and b=96 j=128, in one
# run: dmove's unpadded attention (the flash kernels, src/cuda/flash.cu; the times of its
# ATTN and ATTN_BWD groups from `dmove bench --lengths`, full fill and half fill) and
# PyTorch's scaled_dot_product_attention on each backend that takes the case
# (bench/gpu/attn_sdpa.py: flash without a mask, memory-efficient with a key-padding mask
# and dropout, math). flash-attn from PyPI is not tried: the lent GPU machines reach no
# network. TFLOP/s count the GEMMs (4 b h j^2 d forward, 8 backward) of the real tokens.
# With pack.sh's binaries (.dev carried): LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove
#   sh bench/gpu/attn.sh   (env: SIZES "8x512 96x128", REPS 20)
set -u
SIZES=${SIZES:-8x512 96x128}
REPS=${REPS:-20}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp}
. "$here/common.sh"
gpu_setup test_unpad
gpu_libs "$DMOVE"
echo "attention alone on the GPU: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, GPU ${GPU:-none}"
echo "== dmove bench --device cuda --dtype bf16 --preset bert-large --lengths (its attention groups)"
for s in $SIZES; do
    b=${s%x*}
    j=${s#*x}
    for spec in "uniform:$j-$j" "uniform:$((j / 4))-$((3 * j / 4))"; do
        out=$(timeout 120 "$DMOVE" bench --device cuda --dtype bf16 --preset bert-large --batch "$b" --seq "$j" \
            --lengths "$spec" --reps "$REPS" --warmup 3 2>&1)
        echo "b=$b j=$j $spec: $(echo "$out" | grep -E '^fill|^unpadded attention' | tr '\n' ';')"
        echo "$out" | grep -iE 'note|error' | head -3
    done
done
echo "== torch scaled_dot_product_attention (bench/gpu/attn_sdpa.py)"
sizes=$(echo "$SIZES" | tr ' ' ',')
timeout 240 python3 "$here/attn_sdpa.py" --sizes "$sizes" --reps "$REPS" | tee "$OUT/attn-sdpa.jsonl"
