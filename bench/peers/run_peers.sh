#!/bin/sh
# bench/peers/run_peers.sh: one training step of one BERT encoder layer in recent PyTorch
# (eager and torch.compile), in JAX (jit) and in dmove, interleaved in one run, several
# rounds; prints a table of medians and ratios against dmove's fused schedule and saves it,
# with machine, date, commit and package versions, to bench/results/peers-<date>.txt
# (peers-<date>-b<B>j<J>.txt for other sizes).
#
# Usage: sh bench/peers/run_peers.sh [--large] [--rounds N] [--reps R] [--warmup W]
#          [--batch B] [--seq J] [--hidden I] [--heads H] [--ffn U] [--threads T]
#          [--autotune] [--no-dmove] [--no-wait] [--setup] [--plan FILE] [--out FILE]
#          [--norm pre] [--causal]
# Defaults: BERT-base (b=8 j=128 i=768 h=12 u=3072), 3 rounds, 10 timed reps after 3
# warm-up steps per run, 2 threads. --large: BERT-large-shaped b=2 j=512 i=1024 h=16 u=4096.
# Environment: DMOVE=path/to/dmove (default build/dmove; e.g. a clean clone's build when
# the working tree does not build), VENV=dir (default bench/.venv-peers).
#
# Peers (all fp32, dropout 0.1 on, HF BertLayer train-mode semantics, backward with
# grad_output including the input gradient; what each one runs with is printed under
# "settings"):
#   torch-eager        the venv's PyTorch (PyPI), eager; torch.set_num_threads(T)
#   torch-compile      torch.compile(backend="inductor", mode="default"); compile time in the
#                      warm-up steps, reported as compile_s, not in the medians
#   torch-compile-max-autotune   mode="max-autotune-no-cudagraphs" (only with --autotune:
#                      its compile takes minutes)
#   jax-jit            jax.jit(jax.value_and_grad) over params + input; XLA_FLAGS=
#                      "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=T";
#                      PRNG "rbg"
#   dmove              $DMOVE bench --json --schedule both (fused and unfused interleaved rep
#                      by rep by dmove itself), rows dmove-fused and dmove-unfused; with
#                      --plan FILE (a plan from `dmove tune` for these sizes) also the row
#                      dmove-tuned, that plan run interleaved with the other two
# --norm pre / --causal: dmove's layer variants (pre-LN, causal mask); the torch peers then
# run PyTorch's own nn.TransformerEncoderLayer (norm_first, is_causal; see compile_step.py),
# jax-jit (a BertLayer only) is left out, and the file name gets -pre / -causal.
# Python peers run with glibc malloc kept from mmap/munmap and trimming (MALLOC_* below; no
# jemalloc/tcmalloc on this machine, which PyTorch's tuning guide would suggest instead),
# the setting that made Debian's PyTorch 1.13 1.5x faster (run_torch_vs_dmove.sh).
# The venv is made by setup_venv.sh (--setup runs it first).
# Each run waits for an idle machine and is repeated (up to 4 tries) when other jobs used
# more than 5% of a CPU while it ran; --no-wait turns both off.
set -eu

rounds=3; reps=10; warmup=3; threads=2
batch=8; seq=128; hidden=768; heads=12; ffn=3072
autotune=0; run_dmove=1; wait_idle=1; setup=0; out=""; plan=""; norm=post; causal=0
while [ $# -gt 0 ]; do
    case "$1" in
        --large) batch=2; seq=512; hidden=1024; heads=16; ffn=4096; shift ;;
        --rounds) rounds="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --batch) batch="$2"; shift 2 ;;
        --seq) seq="$2"; shift 2 ;;
        --hidden) hidden="$2"; shift 2 ;;
        --heads) heads="$2"; shift 2 ;;
        --ffn) ffn="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --autotune) autotune=1; shift ;;
        --no-dmove) run_dmove=0; shift ;;
        --no-wait) wait_idle=0; shift ;;
        --setup) setup=1; shift ;;
        --out) out="$2"; shift 2 ;;
        --plan) plan="$2"; shift 2 ;;
        --norm) norm="$2"; shift 2 ;;
        --causal) causal=1; shift ;;
        *) echo "run_peers.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
[ -z "$plan" ] || [ -r "$plan" ] || { echo "run_peers.sh: cannot read --plan $plan (a plan file from dmove tune)" >&2; exit 2; }
case $norm in pre | post) ;; *) echo "run_peers.sh: --norm is pre or post, not '$norm'" >&2; exit 2 ;; esac
[ "$warmup" -ge 2 ] || { echo "run_peers.sh: --warmup must be >= 2 (torch.compile compiles in the first steps)" >&2; exit 2; }

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mkdir -p bench/results
if [ -z "$out" ]; then
    out="bench/results/peers-$(date +%Y-%m-%d)"
    [ "$batch $seq $hidden $heads $ffn" = "8 128 768 12 3072" ] || out="$out-b${batch}j${seq}"
    [ "$norm" = post ] || out="$out-pre"
    [ "$causal" -eq 0 ] || out="$out-causal"
    out="$out.txt"
fi
VENV=${VENV:-$root/bench/.venv-peers}
DMOVE=${DMOVE:-$root/build/dmove}
[ "$setup" -eq 0 ] || sh bench/peers/setup_venv.sh --venv "$VENV"
PY="$VENV/bin/python"
"$PY" -c "import torch, jax" 2>/dev/null || { echo "run_peers.sh: $PY cannot import torch and jax: run sh bench/peers/setup_venv.sh (or pass --setup)" >&2; exit 1; }

MALLOC_FIX="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456"
XLA_FLAGS_VALUE="--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=$threads"

# name|command (the sizes are appended)|environment (jax-jit also gets XLA_FLAGS, below)
variants="torch-eager|compile_step.py --mode eager|$MALLOC_FIX
torch-compile|compile_step.py --mode compile --compile-mode default|$MALLOC_FIX"
[ "$autotune" -eq 0 ] || variants="$variants
torch-compile-max-autotune|compile_step.py --mode compile --compile-mode max-autotune-no-cudagraphs|$MALLOC_FIX"
[ "$norm" != post ] || [ "$causal" -ne 0 ] || variants="$variants
jax-jit|jax_step.py --prng rbg|$MALLOC_FIX"

if [ "$run_dmove" -eq 1 ]; then
    if [ -x "$DMOVE" ] && "$DMOVE" bench --json --schedule both --batch 1 --seq 8 --hidden 16 --heads 2 --ffn 32 --reps 1 --warmup 1 >/dev/null 2>&1; then
        variants="$variants
dmove|-|-"
    else
        echo "run_peers.sh: $DMOVE missing or 'dmove bench --json' failed: peers only (make, or DMOVE=path)" >&2
    fi
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT

quiet_name=run_peers.sh; quiet_py=$PY
. "$root/bench/quiet.sh"  # wait_quiet, clean_run: runs no other job disturbed

nvar=$(printf '%s\n' "$variants" | wc -l)
sizes="--batch $batch --seq $seq --hidden $hidden --heads $heads --ffn $ffn"
[ "$norm" = post ] || sizes="$sizes --norm pre"
[ "$causal" -eq 0 ] || sizes="$sizes --causal"
echo "run_peers.sh: $rounds rounds x $nvar variants, b=$batch j=$seq i=$hidden h=$heads u=$ffn, $threads threads" >&2
r=1
while [ "$r" -le "$rounds" ]; do
    # Rotate the order every round so that no variant always runs first or last.
    printf '%s\n' "$variants" | awk -v r="$r" -v n="$nvar" '{a[NR-1]=$0} END{for(k=0;k<n;k++) print a[(k+r-1)%n]}' > "$raw/order"
    while IFS='|' read -r name cmd envs; do
        case "$name" in
        dmove)
            set -- env -u OMP_PROC_BIND -u LD_LIBRARY_PATH "$DMOVE" bench --json --schedule both $sizes \
                --threads "$threads" --reps "$reps" --warmup "$warmup"
            [ -z "$plan" ] || set -- "$@" --plan "$plan" ;;
        *)
            # shellcheck disable=SC2086
            xla="PEERS_VARIANT=$name"
            [ "$name" = jax-jit ] && xla="XLA_FLAGS=$XLA_FLAGS_VALUE"
            # shellcheck disable=SC2086
            set -- env -u OMP_PROC_BIND -u OMP_NUM_THREADS -u LD_LIBRARY_PATH -u LD_PRELOAD -u XLA_FLAGS \
                -u MALLOC_MMAP_MAX_ -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ -u MALLOC_TOP_PAD_ \
                $envs "$xla" "$PY" bench/peers/$cmd $sizes --reps "$reps" --warmup "$warmup" \
                --threads "$threads" --variant "$name" ;;
        esac
        if clean_run "$raw/out" "$@" && [ -s "$raw/out" ]; then
            printf '%s\t%s\t%s\n' "$r" "$name" "$(tr -d '\n\t' < "$raw/out")" >> "$raw/all"
            echo "  round $r $name done" >&2
        else
            echo "  round $r $name failed" >&2
        fi
    done < "$raw/order"
    r=$((r + 1))
done
[ -s "$raw/all" ] || { echo "run_peers.sh: every run failed" >&2; exit 1; }

{
    echo "# peers: one BERT encoder layer training step (forward + backward), fp32, dropout 0.1, CPU; $norm-LN$([ "$causal" -eq 0 ] || echo ', causal')"
    echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "machine:  $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB), kernel $(uname -r)"
    echo "commit:   $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)'); dmove binary: $DMOVE"
    echo "config:   b=$batch j=$seq i=$hidden h=$heads u=$ffn, $threads threads; $reps timed reps after $warmup warm-up steps per run; $rounds rounds, order rotated each round"
    echo "packages: $("$PY" -c 'import sys, torch, jax, jaxlib, numpy; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {numpy.__version__}")'); $(gcc --version | head -1) (inductor's C++ compiler); $(dpkg -l libopenblas0-openmp libc6 2>/dev/null | awk '/^ii/{printf "%s %s, ", $2, $3}')"
    echo "noise:    waited $waited s for an idle machine; $repeats runs repeated because other jobs used >5% of a CPU meanwhile; $noisy kept although disturbed (checks on: $wait_idle)"
    echo "variants:"
    printf '%s\n' "$variants" | awk -F'|' -v x="$XLA_FLAGS_VALUE" '{printf "  %-28s %s %s%s\n", $1, $2, $3, ($1 == "jax-jit" ? " XLA_FLAGS=\"" x "\"" : "")}'
    echo
    "$PY" - "$raw/all" <<'PY'
import json, statistics, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    r, name, js = line.rstrip("\n").split("\t", 2)
    try:
        d = json.loads(js)
    except ValueError:
        continue
    ents = [(name, d)]
    if name == "dmove":
        ents = [("dmove-" + e.get("schedule", "?"), e) for e in d.get("schedules", [])]
    for n, e in ents:
        if n not in order:
            order.append(n)
        rows.setdefault(n, {})[int(r)] = e
med = statistics.median
def col(name, key):
    v = [d[key] for d in rows[name].values() if isinstance(d.get(key), (int, float))]
    return med(v) if v else None
def ratio(name, base, key="step_ms"):  # median over rounds of per-round ratios
    if base not in rows:
        return None
    v = [rows[name][r][key] / rows[base][r][key] for r in rows[name]
         if r in rows[base] and rows[base][r].get(key) and rows[name][r].get(key)]
    return med(v) if v else None
fmt = lambda x, w=9, p=1: (f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}s}")
print(f"{'variant':28s} {'forward':>9s} {'backward':>9s} {'step':>9s} {'min':>9s} {'compile_s':>9s} {'faults':>8s} {'/dmove':>7s}  (ms, medians over rounds; /dmove = step / dmove-fused step)")
for name in order:
    f, b, s = col(name, "forward_ms"), col(name, "backward_ms"), col(name, "step_ms")
    mn = min((d.get("step_min_ms", d.get("step_ms")) for d in rows[name].values()), default=None)
    print(f"{name:28s} {fmt(f)} {fmt(b)} {fmt(s)} {fmt(mn)} {fmt(col(name, 'compile_s'), 9, 1)} "
          f"{fmt(col(name, 'page_faults_per_step'), 8, 0)} {fmt(ratio(name, 'dmove-fused'), 7, 2)}")
print()
if "jax-jit" in rows:
    print("jax-jit forward: a separate jit of the forward alone (XLA compiles forward+backward as one program).")
for name in ("dmove-fused", "dmove-unfused", "dmove-tuned"):
    if name in rows:
        c, s = col(name, "contractions_alone_ms"), col(name, "step_ms")
        if c:
            print(f"{name}: step {s:.1f} ms, contractions alone {c:.1f} ms, step/contractions {s / c:.3f} (bar: <= 1.2)")
        cls = {}
        for d in rows[name].values():
            for k, v in (d.get("class_ms") or {}).items():
                cls.setdefault(k, []).append(v)
        if cls:
            print("  class_ms: " + ", ".join(f"{k} {med(v):.1f}" for k, v in cls.items()))
for name in order:
    if not name.startswith("dmove-"):
        s = next(iter(rows[name].values())).get("settings", "")
        print(f"settings {name}: {s}")
PY
    echo
    echo "raw (round, variant, JSON):"
    cat "$raw/all"
} | tee "$out"
echo "run_peers.sh: wrote $out" >&2
