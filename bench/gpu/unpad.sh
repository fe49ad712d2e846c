#!/bin/sh
# bench/gpu/unpad.sh: issue 25's point 3 on a GPU: tests/test_unpad on the device first
# (DMOVE_CUDA_EMULATE=0: the unpadded CUDA layer against the padded one, dropout on, and the
# whole model), then the BERT-large layer padded against unpadded (`dmove bench --device cuda
# --dtype bf16 --lengths`, both on the same drawn batches, interleaved) at half fill and at
# full fill, b=8 j=512 and b=96 j=128, ROUNDS times each (default 3); at full fill once more
# with DMOVE_CUDA_ATTN_OP=1 (the padded layer's attention as one op on the flash kernels).
# With pack.sh's binaries (.dev carried): LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove
#   TEST_UNPAD=.dev/bin/test_unpad sh bench/gpu/unpad.sh [ROUNDS]
# Env: MODEL (default "--preset bert-large"), SIZES (default "8x512 96x128"), DTYPE (bf16),
# REPS (20), TEST_EMULATE (0: test_unpad on the GPU). A check of the script without a GPU:
# DMOVE_CUDA_EMULATE=1 TEST_EMULATE=1 MODEL="--hidden 32 --heads 2 --ffn 64" SIZES=2x16 REPS=2
# DTYPE=fp32 sh bench/gpu/unpad.sh 1
set -u
rounds=${1:-3}
MODEL=${MODEL:---preset bert-large}
SIZES=${SIZES:-8x512 96x128}
DTYPE=${DTYPE:-bf16}
REPS=${REPS:-20}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp}
. "$here/common.sh"
gpu_setup test_unpad # builds dmove and tests/test_unpad unless DMOVE names a prebuilt dmove
gpu_libs "$DMOVE"
echo "unpadded layers on the GPU: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT, GPU ${GPU:-none}"
t=${TEST_UNPAD:-$BUILT_TEST}
if [ -z "$t" ] || [ ! -x "$t" ]; then
    echo "test_unpad NOT RUN (TEST_UNPAD='$t' is no executable): the timings below are UNVERIFIED"
else
    if (cd "$root" && DMOVE_CUDA_EMULATE=${TEST_EMULATE:-0} timeout 300 "$t") >"$OUT/test_unpad.txt" 2>&1; then
        grep -E "cuda|checks" "$OUT/test_unpad.txt" | tail -8
    else
        grep -E "FAIL|error" "$OUT/test_unpad.txt" | head -20
        echo "test_unpad FAILED on the GPU: the timings below are UNVERIFIED"
    fi
fi
run() { # run LABEL ARGS...
    label=$1
    shift
    for r in $(seq "$rounds"); do
        # shellcheck disable=SC2086 # MODEL is words
        out=$(timeout 120 "$DMOVE" bench --device cuda --dtype "$DTYPE" $MODEL "$@" --reps "$REPS" --warmup 3 2>&1)
        sp=$(echo "$out" | sed -n 's/^unpadded speedup.*: //p')
        [ -n "$sp" ] || { echo "$label: failed: $(echo "$out" | tail -2)"; continue; }
        printf '%-28s round %d: fill %s  padded %8s ms  unpadded %8s ms  speedup %s\n' "$label" "$r" \
            "$(echo "$out" | sed -n 's/^fill (real tokens \/ b x j): \([0-9.]*\).*/\1/p')" \
            "$(echo "$out" | awk '$1 == "padded" { print $2 }')" \
            "$(echo "$out" | awk '$1 == "unpadded" && $2 != "speedup" { print $2 }')" "$sp"
    done
}
echo "== dmove bench --device cuda --dtype $DTYPE $MODEL --lengths SPEC (medians of $REPS batches)"
for s in $SIZES; do
    b=${s%x*}
    j=${s#*x}
    run "b=$b j=$j uniform:$((j / 4))-$((3 * j / 4))" --batch "$b" --seq "$j" --lengths "uniform:$((j / 4))-$((3 * j / 4))"
    run "b=$b j=$j full" --batch "$b" --seq "$j" --lengths "uniform:$j-$j"
    # the padded layer's attention as one op on the flash kernels, not its ops (the default)
    (export DMOVE_CUDA_ATTN_OP=1; run "b=$b j=$j full, padded flash op" --batch "$b" --seq "$j" --lengths "uniform:$j-$j")
done
