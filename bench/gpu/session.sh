#!/bin/sh
# bench/gpu/session.sh: the device checks still open, in two calls of the device tool (each
# under its 10-minute limit; .dev carried from `PACK=xz sh bench/gpu/pack.sh` here, which it
# unpacks), most important first, each step skipped when too little of BUDGET seconds
# (default 540) is left for it:
#   sh bench/gpu/session.sh 1   # issue 25 first
#    a. tests/test_unpad on the GPU: the flash kernels (src/cuda/flash.cu: cp.async, ldmatrix,
#       the dK dV and dQ blocks, the padded layer's one op with its mask) against fp32, the
#       unpadded layer against the padded one, the whole model; everything after it is
#       UNVERIFIED if it fails (then DMOVE_CUDA_FLASH=0 for the rest);
#    a'. the unpadded layer with lengths the same each batch and varying, the live rows'
#       rounding with the weight gradients' k (the default), without it
#       (DMOVE_CUDA_LIVE_ROUND_K=0) and off (probe_attn.sh PROBE=live);
#    a''. the flash kernels' variants beside the default (bench/gpu/variants.sh run: the
#       binaries of .dev/alt.tar.xz, DMOVE_CUDA_FLASH_MT=2);
#    b. compute-sanitizer (memcheck, racecheck, synccheck) over the flash kernels
#       (bench/gpu/sanitize.sh SETS=flash);
#    c. the BERT-large layer at b=96 j=128 (bench/gpu/run.sh LEAN=1: dmove's default, with
#       the attention as the flash one op, unpadded at half fill; PyTorch eager
#       SDPA and torch.compile max-autotune; the roofline floor; issue 25's point 4);
#    d. attention alone against SDPA's backends (bench/gpu/attn.sh, point 2).
#   sh bench/gpu/session.sh 2   # the rest
#    e'. Nsight Compute on each flash kernel: throughput, occupancy, stall reasons
#       (probe_attn.sh PROBE=ncu);
#    e. the layer at b=8 j=512 (run.sh LEAN=1);
#    f. tests/test_model on the GPU (the fused cross-entropy of src/cuda/xent.cu);
#    g. dmove.torch's GPU tests, then dmove.torch.patch on BERT-large bf16 against eager
#       (issue 28's point 4);
#    h. NCCL's all-reduce with one rank (issue 27): dmove pretrain with and without
#       DMOVE_DIST_REDUCE_ALONE=1, the same results;
#    i. the whole BertForMaskedLM under torch.compile max-autotune at b=8 j=512 (issue 24's
#       point 7), with what is left.
# SKIP_x=1 (x: UNPAD, LIVE, VARIANTS, SANITIZE, LAYER, ATTN, NCU, MODEL, PYTHON, PATCHED, NCCL, COMPILE) skips
# a step.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp}
mkdir -p "$OUT" || exit 1
if [ -r "$root/.dev/pack.tar.xz" ]; then
    tar -xJf "$root/.dev/pack.tar.xz" -C "$root/.dev" || exit 1
    export LD_LIBRARY_PATH="$root/.dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" DMOVE="$root/.dev/bin/dmove" \
        TEST_UNPAD="$root/.dev/bin/test_unpad"
fi
# fail in seconds, not after the machine's minutes, without the binaries
if [ "${SKIP_UNPAD:-0}" != 1 ] && { [ ! -x "${DMOVE:-}" ] || [ ! -x "${TEST_UNPAD:-}" ]; }; then
    echo "no dmove and test_unpad: carry .dev from \`PACK=xz sh bench/gpu/pack.sh\` (DMOVE='${DMOVE:-}'," \
        "TEST_UNPAD='${TEST_UNPAD:-}')"
    exit 1
fi
BUDGET=${BUDGET:-540}
PHASE=${1:-1}
start=$(date +%s)
# step NAME SECONDS: whether to run step NAME (not skipped, and SECONDS of the budget left)
step() {
    eval "skip=\${SKIP_$1:-0}"
    [ "$skip" = 1 ] && return 1
    left=$((BUDGET - ($(date +%s) - start)))
    [ "$left" -ge "$2" ] && return 0
    echo "== $1: skipped, $left s of the budget left (it needs $2)"
    return 1
}
echo "session phase $PHASE: $(date -u +%Y-%m-%dT%H:%MZ), $(cat "$root/.dev/COMMIT" 2>/dev/null || echo "commit ?")," \
    "GPU $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
if [ "$PHASE" = 1 ] && step UNPAD 60; then # the flash kernels' first run on a GPU
    echo
    echo "== tests/test_unpad on the GPU"
    if (cd "$root" && DMOVE_CUDA_EMULATE=0 timeout 200 "$TEST_UNPAD") >"$OUT/test_unpad.txt" 2>&1; then
        grep -E "flash|one op|checks" "$OUT/test_unpad.txt" | tail -14
    else
        grep -E "FAIL|error" "$OUT/test_unpad.txt" | head -20
        tail -2 "$OUT/test_unpad.txt"
        echo "test_unpad FAILED on the GPU: the rest runs with DMOVE_CUDA_FLASH=0 (UNVERIFIED otherwise)"
        export DMOVE_CUDA_FLASH=0
    fi
fi
if [ "$PHASE" = 1 ] && step LIVE 90; then # issue 25, point 3: do varying lengths still cost?
    echo
    echo "== the unpadded layer's step with lengths the same each batch and varying (bench/gpu/probe_attn.sh PROBE=live)"
    DMOVE="$DMOVE" PROBE=live timeout 150 sh "$here/probe_attn.sh" || echo "probe_attn.sh: exit $?"
fi
if [ "$PHASE" = 1 ] && step VARIANTS 150; then # issue 25, point 1: the flash kernels' variants side by side
    echo
    echo "== the flash kernels' variants (bench/gpu/variants.sh run; .dev/alt.tar.xz from variants.sh build, if any)"
    timeout 240 sh "$here/variants.sh" run mt2=DMOVE_CUDA_FLASH_MT=2 || echo "variants.sh: exit $?"
fi
if [ "$PHASE" = 1 ] && step SANITIZE 90; then # issue 25, point 5
    echo
    echo "== compute-sanitizer (memcheck, racecheck, synccheck) over the flash kernels"
    DMOVE="$DMOVE" SETS=flash timeout 180 sh "$here/sanitize.sh" "$OUT/sanitize" || echo "sanitize.sh: exit $?"
fi
for s in 96x128 8x512; do # issue 25, point 4: the layer against the peers
    [ "$s" = 96x128 ] && [ "$PHASE" != 1 ] && continue
    [ "$s" = 8x512 ] && [ "$PHASE" != 2 ] && continue
    step LAYER 200 || continue
    echo
    echo "== the BERT-large layer, $s (bench/gpu/run.sh LEAN=1)"
    left=$((BUDGET - ($(date +%s) - start)))
    DMOVE="$DMOVE" LEAN=1 SIZES=$s REPS=20 COMPILE_TIMEOUT=$((left - 90)) timeout $((left - 20)) \
        sh "$here/run.sh" "$OUT/layer-$s" || echo "run.sh: exit $?"
done
if [ "$PHASE" = 1 ] && step ATTN 120; then # issue 25, point 2
    echo
    timeout 200 sh "$here/attn.sh" || echo "attn.sh: exit $? (200 s at most)"
fi
[ "$PHASE" = 1 ] && { echo "phase 1 done in $(($(date +%s) - start)) s"; exit 0; }
if step NCU 230; then # issue 25, point 1: why the flash kernels are slow
    echo
    echo "== Nsight Compute on each flash kernel (bench/gpu/probe_attn.sh PROBE=ncu)"
    DMOVE="$DMOVE" PROBE=ncu NCU_OUT="$OUT" timeout 230 sh "$here/probe_attn.sh" || echo "probe_attn.sh: exit $?"
fi
if step MODEL 100 && [ -x "$root/.dev/bin/test_model" ]; then # the fused cross-entropy on the device
    echo
    echo "== tests/test_model on the GPU (BertForMaskedLM against transformers; LINEAR_XENT of xent.cu too)"
    DMOVE_CUDA_EMULATE=0 timeout 150 "$root/.dev/bin/test_model" >"$OUT/test_model.txt" 2>&1
    echo "test_model: exit $?"; grep -E 'fused-xent on, cuda|FAIL|checks' "$OUT/test_model.txt" | tail -8
fi
if step PYTHON 60 && [ -r "$root/.dev/lib/libdmove.so" ]; then
    echo
    echo "== dmove.torch on the GPU (tests/python/test_torch.py -k 'gpu or cuda')"
    (cd "$root" && env -u DMOVE_CUDA_EMULATE DMOVE_LIB="$root/.dev/lib/libdmove.so" PYTHONPATH="$root/python" \
        timeout 120 python3 -m pytest -q -rfEs -p no:cacheprovider tests/python/test_torch.py -k "gpu or cuda" \
        >"$OUT/pytest.txt" 2>&1
    echo "pytest: exit $?"; tail -15 "$OUT/pytest.txt")
fi
if step PATCHED 100 && [ -r "$root/.dev/lib/libdmove.so" ]; then # issue 28, point 4
    echo
    echo "== transformers' BertForMaskedLM (BERT-large, bf16 autocast, b=32 j=128): eager vs dmove.torch.patch"
    (cd "$root" && env -u DMOVE_CUDA_EMULATE DMOVE_LIB="$root/.dev/lib/libdmove.so" PYTHONPATH="$root/python" \
        timeout 150 python3 bench/peers/python_step.py --device cuda --dtype bf16 --large --batch 32 --rounds 8 \
        --no-compile >"$OUT/python-step-gpu.txt" 2>&1
    echo "python_step: exit $?"; tail -12 "$OUT/python-step-gpu.txt")
fi
if step NCCL 120; then # issue 27: NCCL's path with one rank
    echo
    echo "== dmove pretrain --device cuda --dtype bf16, one rank on NCCL's reduction (DMOVE_DIST_REDUCE_ALONE=1) vs none"
    d=$(mktemp -d)
    zcat "$root/tests/text/corpus/man-rendered.txt.gz" | head -20000 >"$d/c.txt"
    tok="$root/tests/text/tok/bert-base-uncased.json"
    "$DMOVE" prepare --tokenizer "$tok" --out "$d/data" --valid-fraction 0.05 "$d/c.txt" >/dev/null 2>&1 ||
        echo "prepare failed"
    for alone in 0 1; do
        DMOVE_DIST_REDUCE_ALONE=$alone NCCL_DEBUG=WARN timeout 120 "$DMOVE" pretrain --data "$d/data" --tokenizer "$tok" \
            --device cuda --dtype bf16 --layers 4 --hidden 256 --heads 4 --ffn 1024 --seq 128 --batch 32 --steps 30 \
            --eval-every 15 --pairs --json >"$OUT/nccl-$alone.json" 2>"$OUT/nccl-$alone.err"
        echo "alone=$alone: exit $?; $(grep -E '^loss|^time per step' "$OUT/nccl-$alone.err" | tr '\n' ' ')"
        grep -iE 'nccl|error' "$OUT/nccl-$alone.err" | head -3
    done
    python3 - "$OUT/nccl-0.json" "$OUT/nccl-1.json" <<'PY'
import json, sys
def last_json(f):  # the report's line: NCCL_DEBUG writes NCCL's own lines to stdout too
    lines = [l for l in open(f) if l.startswith("{")]
    return json.loads(lines[-1]) if lines else json.loads("")
try:
    a, b = (last_json(f) for f in sys.argv[1:])
except (OSError, ValueError) as e:
    sys.exit(f"no JSON to compare: {e}")
keys = ("loss_first", "loss_last", "eval_loss", "eval_accuracy")
same = all(a.get(k) == b.get(k) for k in keys)
print(("the same" if same else "DIFFERENT:"), {k: (a.get(k), b.get(k)) for k in keys},
      "reduce_ms (alone):", b.get("reduce_ms"), "ms per step:", a.get("step_ms_median"), b.get("step_ms_median"))
PY
    rm -rf "$d"
fi
left=$((BUDGET - ($(date +%s) - start)))
echo
echo "== torch.compile (max-autotune) BertForMaskedLM, BERT-large bf16, b=8 j=512: $left s left"
if step COMPILE 300; then # it did not finish in 265 s before: less is wasted time
    PYTHONUNBUFFERED=1 timeout "$left" python3 "$here/bert_gpu.py" --device cuda --layers 24 --hidden 1024 \
        --heads 16 --ffn 4096 --vocab 30522 --batch 8 --seq 512 --mode compile --compile-mode max-autotune \
        --reps 10 --warmup 3 2>"$OUT/compile.err" | tee "$OUT/compile.jsonl"
    [ -s "$OUT/compile.jsonl" ] || echo "torch.compile did not finish in $left s (its log: $OUT/compile.err)"
fi
echo "done in $(($(date +%s) - start)) s"
