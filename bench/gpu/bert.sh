#!/bin/sh
# bench/gpu/bert.sh: the whole BERT (BertForMaskedLM) on a GPU, in one call (aimed at under
# 8 to 9 minutes on an H100 with prebuilt binaries, .dev/pack.tar.xz of `PACK=bert sh
# bench/gpu/pack.sh`;
# each phase has its own timeout and the script skips what would pass BUDGET seconds,
# default 540, so the summary always comes back inside the device tool's 10 minutes):
#   1. the CUDA tests on the device (a failure is said, and the timings after it are
#      marked UNVERIFIED, not skipped: the device time is scarce): tests/test_model_ops (the
#      embeddings' and head's operators; EMBED_BWD against the CPU kernel with duplicate,
#      invalid and all-equal ids, two runs bit-identical; a small model's whole step against
#      PyTorch, fp32 and bf16) and tests/test_model (whole BertForMaskedLM steps against
#      transformers, fp32 and bf16 storage, --rows and --streams at the GPU's defaults;
#      the BERT trainer CPU vs GPU, resumed bit-identically) with DMOVE_CUDA_EMULATE=0;
#      and, last, after the timings, if the budget allows, tests/test_cuda (every group
#      and whole layers against the CPU backend, DMOVE_TEST_EMULATE=0, interpreting row
#      kernel) unless TESTS=model;
#   2. BERT-large (24 layers, i=1024 h=16 u=4096, vocab 30522, dropout 0.1) training steps
#      in bf16 at b=64 j=128 and b=8 j=512: dmove's whole step (bench/gpu/bert_step.c:
#      dm_trainer_new_bert, the batch set and dm_trainer_step, AdamW over fp32 master
#      weights; the head scores the masked positions only, b*j/5 rows) against transformers'
#      BertForMaskedLM (bench/gpu/bert_gpu.py: SDPA attention, autocast bf16, AdamW
#      fused; the decoder over all b*j rows, as transformers does) eager and
#      torch.compile(mode=max-autotune), interleaved: dmove, eager, dmove, eager, then
#      compile (last: the slowest to start); sequences/s from each run's median step,
#      the ratio against eager from the runs' medians, all on this GPU in this run.
# Usage: sh bench/gpu/bert.sh [OUTDIR]
# With prebuilt binaries (the device tool: run `PACK=bert sh bench/gpu/pack.sh` here, carry
# .dev, and there just `sh bench/gpu/bert.sh "$OUT/b"`: it unpacks .dev/pack.tar.xz), or
# BIN=folder (and LD_LIBRARY_PATH) naming them.
# Env: BIN (a folder with bert_step, test_model, test_model_ops, test_cuda; else built
#      here by make, in BUILD, default build), PYTHON (default python3, torch with CUDA and transformers), SIZES
#      (default "64x128 8x512"), LAYERS (24), STEPS (timed steps per run, default 10),
#      TESTS (all, model, or 0), COMPILE=0 skips torch.compile, COMPILE_MODE (default
#      max-autotune), COMPILE_TIMEOUT (seconds per size, default 110), BUDGET (540),
#      SANITIZE=1: test_model_ops under compute-sanitizer memcheck and racecheck too,
#      ROWS (dmove's --rows: interp, gen, auto; default the GPU's, auto, measured per
#      group when the trainer is made: setup_s in the JSON).
# On a machine without a GPU, CHECK_CPU=1 runs the same tiny (2 layers, i=64, vocab 1000,
# b=2 j=16, dmove on the CPU, PyTorch eager and compile on the CPU): a check of the script.
set -u
OUT=${1:-bench-gpu-bert-out}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
SIZES=${SIZES:-"64x128 8x512"}
LAYERS=${LAYERS:-24}
STEPS=${STEPS:-10}
TESTS=${TESTS:-all}
COMPILE=${COMPILE:-1}
COMPILE_MODE=${COMPILE_MODE:-max-autotune}
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-110}
BUDGET=${BUDGET:-540}
ROWSOPT=${ROWS:+--rows $ROWS}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
# left SECONDS: 0 (true) if SECONDS more fit in the budget
left() { [ $(($(elapsed) + $1)) -le "$BUDGET" ]; }

DEV=cuda DTYPE=bf16
MODEL="--layers $LAYERS --hidden 1024 --heads 16 --ffn 4096 --vocab 30522"
TITLE="BERT-large ($LAYERS layers)"
TORCHDEV=cuda
if [ "${CHECK_CPU:-0}" = 1 ]; then # dmove fp32 on the CPU (its backend's only type), PyTorch bf16 autocast
    DEV=cpu DTYPE=fp32 TORCHDEV=cpu SIZES=${CHECK_SIZES:-"2x16"} STEPS=2 TESTS=0
    MODEL="--layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 1000"
    TITLE="a tiny BERT (CHECK_CPU)"
    COMPILE_MODE=${CHECK_COMPILE_MODE:-default}
fi

if [ -z "${BIN:-}" ] && [ -r "$root/.dev/pack.tar.xz" ]; then # PACK=bert sh bench/gpu/pack.sh's
    pk=${TMPDIR:-/tmp}/dmove-bert-pack
    rm -rf "$pk" && mkdir -p "$pk" && tar -xJf "$root/.dev/pack.tar.xz" -C "$pk" || exit 1
    BIN=$pk/bin
    export LD_LIBRARY_PATH="$pk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -z "${BIN:-}" ]; then
    echo "building (make -C $root)" >&2
    B=${BUILD:-build}
    tests="$B/tests/test_model $B/tests/test_model_ops $B/tests/test_cuda"
    [ "${CHECK_CPU:-0}" = 1 ] && tests=
    # shellcheck disable=SC2086 # tests is words
    { make -C "$root" BUILD="$B" -j"$(nproc)" $tests "$B/libdmove.a" &&
        make -C "$root" BUILD="$B" -f Makefile -f bench/gpu/bench.mk "$B/bench/bert_step"; } >"$OUT/build.log" 2>&1 ||
        { tail -20 "$OUT/build.log"; exit 1; }
    BIN=$OUT/bin
    mkdir -p "$BIN"
    cp "$root/$B/bench/bert_step" "$BIN/"
    for t in $tests; do cp "$root/$t" "$BIN/"; done
fi
BIN=$(cd "$BIN" && pwd) # absolute: the tests run from the root
# shellcheck disable=SC2034 # read by gpu_setup (common.sh): prebuilt, it builds nothing
DMOVE=$BIN/bert_step
. "$here/common.sh"
gpu_libs "$DMOVE"
gpu_setup test_cuda # DMOVE set: builds nothing; NVRTC's headers, COMMIT, GPU
echo "whole BERT on the GPU: $(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT"
echo "GPU: ${GPU:-none}; torch: $($PYTHON -c 'import torch; print(torch.__version__)' 2>/dev/null);" \
    "transformers: $($PYTHON -c 'import transformers; print(transformers.__version__)' 2>/dev/null)"

VERIFIED=1
run_test() { # run_test NAME SECONDS ENV...: tests/NAME on the device, from the root (references)
    name=$1 secs=$2
    shift 2
    echo
    echo "== $name on the GPU =="
    if ! (cd "$root" && env "$@" timeout "$secs" "$BIN/$name") >"$OUT/$name.txt" 2>&1; then
        grep -E "FAIL|error|SKIP" "$OUT/$name.txt" | head -30
        tail -3 "$OUT/$name.txt"
        echo "$name FAILED on the GPU (or timed out after $secs s): the benchmark below is UNVERIFIED"
        VERIFIED=0
        return
    fi
    grep -E "cuda|CUDA|SKIP|^tests/" "$OUT/$name.txt" | head -40
}
if [ "$TESTS" != 0 ]; then
    run_test test_model_ops 90 DMOVE_CUDA_EMULATE=0
    run_test test_model 150 DMOVE_CUDA_EMULATE=0
    if [ "${SANITIZE:-0}" = 1 ]; then # the scatter's kernels (shared-memory scans) under compute-sanitizer
        for tool in memcheck racecheck; do
            (cd "$root" && DMOVE_CUDA_EMULATE=0 timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
                "$BIN/test_model_ops") >"$OUT/sanitize-$tool.txt" 2>&1
            echo "compute-sanitizer --tool $tool test_model_ops: exit $? ($(grep -c "ERROR SUMMARY: 0" "$OUT/sanitize-$tool.txt") clean summaries)"
        done
    fi
    echo "(tests done at $(elapsed) s)"
fi

dmove_run() { # dmove_run B J TAG
    left 60 || { echo "  dmove b=$1 j=$2: skipped (budget)"; return; }
    # shellcheck disable=SC2086 # MODEL is words
    # shellcheck disable=SC2086 # ROWSOPT is words
    if timeout 150 "$BIN/bert_step" --device "$DEV" --dtype "$DTYPE" $MODEL $ROWSOPT --batch "$1" --seq "$2" \
        --steps "$STEPS" --warmup 3 >"$OUT/dmove-$3.json" 2>"$OUT/dmove-$3.err"; then
        cat "$OUT/dmove-$3.json" >>"$OUT/bert-b$1j$2.jsonl"
    else
        echo "  dmove b=$1 j=$2 failed:"
        tail -3 "$OUT/dmove-$3.err"
    fi
}
torch_run() { # torch_run B J MODE TAG SECONDS
    left "$5" || { echo "  PyTorch $3 b=$1 j=$2: skipped (budget)"; return; }
    # shellcheck disable=SC2086
    timeout "$5" $PYTHON "$here/bert_gpu.py" --device "$TORCHDEV" $MODEL --batch "$1" --seq "$2" --mode "$3" \
        --compile-mode "$COMPILE_MODE" --reps "$STEPS" --warmup 3 >>"$OUT/bert-b$1j$2.jsonl" 2>"$OUT/torch-$4.err"
    rc=$?
    [ $rc = 124 ] && echo "  PyTorch $3 b=$1 j=$2: timed out after $5 s$([ "$3" = compile ] &&
        echo " (COMPILE_TIMEOUT=500 SIZES=one size TESTS=0: a call of its own)")"
    [ $rc != 0 ] && [ $rc != 124 ] && { echo "  PyTorch $3 b=$1 j=$2 failed:"; tail -3 "$OUT/torch-$4.err"; }
}

for s in $SIZES; do
    b=${s%x*}
    j=${s#*x}
    echo
    echo "== $TITLE BertForMaskedLM training step, bf16, b=$b j=$j, $STEPS steps a run (at $(elapsed) s)$([ $VERIFIED = 1 ] || echo ", UNVERIFIED: a test failed") =="
    : >"$OUT/bert-b${b}j$j.jsonl"
    dmove_run "$b" "$j" "b${b}j$j-1"
    torch_run "$b" "$j" eager "b${b}j$j-eager1" 90
    dmove_run "$b" "$j" "b${b}j$j-2"
    torch_run "$b" "$j" eager "b${b}j$j-eager2" 90
    [ "$COMPILE" != 0 ] && torch_run "$b" "$j" compile "b${b}j$j-compile" "$COMPILE_TIMEOUT"
    $PYTHON - "$OUT/bert-b${b}j$j.jsonl" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        t = json.loads(line)
        runs.setdefault((t["framework"], t["recipe"]), []).append(t)
eager = [t["step_ms"] for (f, _), ts in runs.items() if f == "pytorch-eager" for t in ts]
base = statistics.median(eager) if eager else None
print(f"{'':58s} {'runs':>4s} {'step ms':>9s} {'seq/s':>8s} {'vs eager':>9s} {'loss':>7s}")
for (f, recipe), ts in runs.items():
    ms = statistics.median(t["step_ms"] for t in ts)
    seq = ts[0]["batch"] * 1e3 / ms
    ratio = f"{base / ms:8.2f}x" if base else "       -"
    each = ", ".join(f"{t['step_ms']:.1f}" for t in ts)
    print(f"{f + ' (' + recipe + ')':58s} {len(ts):4d} {ms:9.2f} {seq:8.1f} {ratio} {ts[-1]['loss']:7.3f}  [{each}]")
for (f, recipe), ts in runs.items():
    t = ts[-1]
    if "phase_ms" in t:
        ph = ", ".join(f"{k} {v:.1f}" for k, v in t["phase_ms"].items())
        print(f"  {f} phases, ms a step (its last run): {ph}; made in {t['setup_s']:.1f} s; memory {t['memory_mb']:.0f} MB")
    elif t.get("peak_mb") is not None:
        print(f"  {f}: peak memory {t['peak_mb']} MB" + (f", compiled in {t['compile_s']} s" if t.get("compile_s") else ""))
print("(step ms: the median of the runs' median steps, each run's in brackets; dmove: the batch set and the step,"
      " the head on the masked rows; PyTorch: inputs on the device, the decoder on all rows as transformers does)")
PY
done
# the layers' suite last (what this run changed in it is tested above): if the budget allows
if [ "$TESTS" = all ]; then
    if left 150; then
        run_test test_cuda 150 DMOVE_TEST_EMULATE=0 DMOVE_TEST_GEN=0
    else
        echo
        echo "test_cuda: skipped (budget; TESTS=all SIZES=none-of-them, e.g. SIZES=\" \", runs it alone)"
    fi
fi
echo
echo "done in $(elapsed) s; raw JSON and logs in $OUT"
