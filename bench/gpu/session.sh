#!/bin/sh
# bench/gpu/session.sh: the device checks still open, as one call of the device tool (about
# 9 minutes; .dev carried from `PACK=xz sh bench/gpu/pack.sh` here, which it unpacks):
#   sh bench/gpu/session.sh
#  1. bench/gpu/unpad.sh 2: tests/test_unpad on the GPU (the unpadded CUDA layer and model
#     against the padded ones), then the BERT-large layer padded vs unpadded (issue 25's
#     point 3) at half and full fill, b=8 j=512 and b=96 j=128;
#  1a. bench/gpu/attn.sh: attention alone, dmove's flash kernels (src/cuda/flash.cu, new
#     since the last GPU run: test_unpad above runs them against fp32 first) against
#     PyTorch's SDPA backends, b=8 j=512 and b=96 j=128 (issue 25's point 2; SKIP_ATTN=1
#     skips it);
#  1a'. compute-sanitizer over the flash kernels (bench/gpu/sanitize.sh SETS=flash: the
#     padded layer's one op with its mask, the unpadded with lengths, causal; SKIP_SANITIZE=1
#     skips it);
#  1b. tests/test_model on the GPU: the whole model's CUDA steps, the fused cross-entropy
#     (src/cuda/xent.cu, new since the last GPU run) among them;
#  2. dmove.torch's GPU tests (the CUDA build's libdmove.so from the pack; SKIP_PYTHON=1 skips them);
#  2b. dmove.torch.patch on BERT-large bf16 against eager (issue 28's point 4 on a GPU;
#     SKIP_PATCHED=1 skips it);
#  3. NCCL's all-reduce with one rank (issue 27): dmove pretrain on the GPU with and without
#     DMOVE_DIST_REDUCE_ALONE=1, the same results (SKIP_NCCL=1 skips it);
#  4. transformers' BertForMaskedLM (BERT-large, bf16) under torch.compile mode
#     max-autotune at b=8 j=512, the peer bench/gpu/bert.sh could not wait for (issue 24's
#     point 7; it did not finish compiling in 265 s on an H200), with what is left of
#     BUDGET seconds (default 540).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp}
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
start=$(date +%s)
[ "${SKIP_UNPAD:-0}" = 1 ] || timeout 330 sh "$here/unpad.sh" 2 || echo "unpad.sh: exit $? (330 s at most)"
if [ "${SKIP_ATTN:-${SKIP_UNPAD:-0}}" != 1 ]; then # issue 25, point 2
    echo
    timeout 200 sh "$here/attn.sh" || echo "attn.sh: exit $? (200 s at most)"
fi
if [ "${SKIP_SANITIZE:-${SKIP_UNPAD:-0}}" != 1 ]; then # issue 25, point 5: the flash kernels under compute-sanitizer
    echo
    echo "== compute-sanitizer (memcheck, racecheck, synccheck) over the flash kernels"
    DMOVE="$DMOVE" SETS=flash timeout 180 sh "$here/sanitize.sh" "$OUT/sanitize" || echo "sanitize.sh: exit $?"
fi
if [ "${SKIP_UNPAD:-0}" != 1 ] && [ -x "$root/.dev/bin/test_model" ]; then # the fused cross-entropy on the device
    echo
    echo "== tests/test_model on the GPU (BertForMaskedLM against transformers; LINEAR_XENT of xent.cu too)"
    DMOVE_CUDA_EMULATE=0 timeout 150 "$root/.dev/bin/test_model" >"$OUT/test_model.txt" 2>&1
    echo "test_model: exit $?"; grep -E 'fused-xent on, cuda|FAIL|checks' "$OUT/test_model.txt" | tail -8
fi
if [ "${SKIP_PYTHON:-${SKIP_UNPAD:-0}}" != 1 ] && [ -r "$root/.dev/lib/libdmove.so" ]; then
    echo
    echo "== dmove.torch on the GPU (tests/python/test_torch.py -k 'gpu or cuda')"
    (cd "$root" && env -u DMOVE_CUDA_EMULATE DMOVE_LIB="$root/.dev/lib/libdmove.so" PYTHONPATH="$root/python" \
        timeout 120 python3 -m pytest -q -rfEs -p no:cacheprovider tests/python/test_torch.py -k "gpu or cuda" \
        >"$OUT/pytest.txt" 2>&1
    echo "pytest: exit $?"; tail -15 "$OUT/pytest.txt")
fi
if [ "${SKIP_PATCHED:-${SKIP_UNPAD:-0}}" != 1 ] && [ -r "$root/.dev/lib/libdmove.so" ]; then # issue 28, point 4
    echo
    echo "== transformers' BertForMaskedLM (BERT-large, bf16 autocast, b=32 j=128): eager vs dmove.torch.patch"
    (cd "$root" && env -u DMOVE_CUDA_EMULATE DMOVE_LIB="$root/.dev/lib/libdmove.so" PYTHONPATH="$root/python" \
        timeout 150 python3 bench/peers/python_step.py --device cuda --dtype bf16 --large --batch 32 --rounds 8 \
        --no-compile >"$OUT/python-step-gpu.txt" 2>&1
    echo "python_step: exit $?"; tail -12 "$OUT/python-step-gpu.txt")
fi
if [ "${SKIP_NCCL:-${SKIP_UNPAD:-0}}" != 1 ]; then # issue 27: NCCL's path with one rank
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
try:
    a, b = (json.load(open(f)) for f in sys.argv[1:])
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
if [ "$left" -gt 300 ]; then # it did not finish in 265 s before: less is wasted time
    PYTHONUNBUFFERED=1 timeout "$left" python3 "$here/bert_gpu.py" --device cuda --layers 24 --hidden 1024 \
        --heads 16 --ffn 4096 --vocab 30522 --batch 8 --seq 512 --mode compile --compile-mode max-autotune \
        --reps 10 --warmup 3 2>"$OUT/compile.err" | tee "$OUT/compile.jsonl"
    [ -s "$OUT/compile.jsonl" ] || echo "torch.compile did not finish in $left s (its log: $OUT/compile.err)"
else
    echo "skipped: too little time left for it (a call of its own: BUDGET=540 and SKIP_UNPAD=1)"
fi
echo "done in $(($(date +%s) - start)) s"
