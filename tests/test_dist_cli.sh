#!/bin/sh
# test_dist_cli.sh: data parallelism end to end under `mpirun -np 2` (Open MPI; as root,
# OMPI_ALLOW_RUN_AS_ROOT is set here). With a dmove built with MPI:
#   - tests/test_dist as 2 ranks (every trainer kind against one process with the global
#     batch; checkpoints and resumes);
#   - `dmove pretrain` and `dmove train` on 2 ranks x b=4 against 1 process x b=8: the same
#     losses (dropout 0);
#   - a resume with the same 2 ranks bit-identical to the uninterrupted run, and alone with
#     b=8 going on from the same checkpoint;
#   - ranks launched with different options refuse to start, naming them;
#   - a rank that hangs (SIGSTOP) stops the other within DMOVE_DIST_TIMEOUT, named, also
#     while rank 0 writes a checkpoint (a wait of an hour for the others only); a rank
#     that dies (SIGKILL) ends the job; the last checkpoint stays whole.
# With a dmove built without MPI: a launch that says it is one of 2 ranks is refused,
# saying how to build with MPI (the suite's ASan build is built so).
# Usage: DMOVE=build/dmove sh tests/test_dist_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_dist_cli.sh dmove_dist
TESTS=$(dirname "$DMOVE")/tests
cd "$T" || exit 1

if ! "$DMOVE" --version | grep -q '^data parallelism: MPI'; then
    cases=$((cases + 1))
    OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$DMOVE" train --steps 1 --hidden 32 --heads 2 --ffn 64 \
        --seq 8 --batch 2 --layers 1 >stdout 2>stderr && fail "built without MPI: a launch of 2 ranks was not refused"
    grep -q 'built without MPI' stderr && grep -q 'make MPI=1' stderr ||
        fail "built without MPI: the refusal does not say so: $(cat stderr)"
    echo "ok   built without MPI: a rank of 2 is refused: $(head -1 stderr)"
    echo "SKIP: the 2-rank runs: this dmove was built without MPI"
    echo "test_dist_cli.sh: $cases cases, $fails failed"
    [ "$fails" -eq 0 ]
    exit
fi
if ! command -v mpirun >/dev/null 2>&1; then
    echo "FAIL: dmove was built with MPI, but there is no mpirun (apt-get install openmpi-bin)" >&2
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one thread a rank (the CPU has 2 cores), and what mpirun says about itself left out
export OMP_NUM_THREADS=1 OMPI_MCA_btl_base_warn_component_unused=0
MPIRUN="mpirun --oversubscribe -np 2"
run2() { # run2 NAME ARGS...: mpirun -np 2 dmove ARGS must exit 0
    name=$1
    shift
    cases=$((cases + 1))
    $MPIRUN "$DMOVE" "$@" >stdout 2>stderr
    rc=$?
    [ "$rc" -eq 0 ] || { fail "$name: exit $rc (mpirun -np 2 dmove $*)"; sed 's/^/    /' stderr >&2; }
}
# json_num FILE KEY: a number of a one-line JSON object
json_num() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }
close() { # close NAME A B TOL: |A - B| <= TOL * |B|
    cases=$((cases + 1))
    awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
        exit !(a != "" && d <= t * m) }' || fail "$1: $2 vs $3"
}

# --- the library's test, as 2 ranks
cases=$((cases + 1))
if $MPIRUN "$TESTS/test_dist" >tdist.out 2>&1; then
    sed 's/^/    /' tdist.out | grep -v '^    $'
else
    fail "test_dist as 2 ranks"
    cat tdist.out >&2
fi

# --- pretrain: 2 ranks x b=4 against 1 x b=8
{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in the a quick brown fox jumps over lazy dog cat sat on mat hello world and then it was is in of to \
             run ran home . , '!'; do
        echo "$w"
    done
} >vocab.txt
i=0
while [ $i -lt 200 ]; do
    printf 'the quick brown fox jumps over the lazy dog.\nthe cat sat on the mat.\nhello world, the dog ran home!\n\n'
    i=$((i + 1))
done >corpus.txt
good "prepare" prepare --tokenizer vocab.txt --lowercase --out data --valid-fraction 0.1 corpus.txt
P="pretrain --data data --tokenizer vocab.txt --lowercase --layers 2 --hidden 32 --heads 2 --ffn 64 --seq 32 \
--lr 3e-3 --warmup 2 --dropout 0 --steps 6 --eval-every 3 --eval-batches 2 --threads 1"
# shellcheck disable=SC2086 # P is words
good "pretrain alone, b=8" $P --batch 8 --json
cp stdout one.json
# shellcheck disable=SC2086
run2 "pretrain, 2 ranks x b=4" $P --batch 4 --json
cp stdout two.json
for k in loss_first loss_last eval_loss eval_accuracy; do
    close "pretrain: $k, 2 ranks x b=4 vs 1 x b=8" "$(json_num two.json $k)" "$(json_num one.json $k)" 1e-5
done
# masking 40% of the tokens: every sequence has more masked positions than its share of
# --predictions (ceil(32 / 5) = 7 of about 13); the share is per sequence, so 2 ranks still
# score the positions one process scores
# shellcheck disable=SC2086
good "pretrain alone, b=8, 40% masked" $P --batch 8 --mask-prob 0.4 --json
cp stdout one40.json
# shellcheck disable=SC2086
run2 "pretrain, 2 ranks x b=4, 40% masked" $P --batch 4 --mask-prob 0.4 --json
cp stdout two40.json
for k in loss_first loss_last eval_loss masked_scored masked_left_out; do
    close "pretrain 40% masked: $k, 2 ranks x b=4 vs 1 x b=8" "$(json_num two40.json $k)" "$(json_num one40.json $k)" 1e-5
done
awk -v d="$(json_num one40.json masked_left_out)" 'BEGIN { exit !(d > 0) }' ||
    fail "pretrain 40% masked: no masked position was left out (the case is meant to cap)"
has "pretrain --json: ranks" two.json '"ranks":2,"reduce_ms":\{"busy":[0-9.]+,"exposed":[0-9.]+\}'
echo "ok   pretrain: 2 ranks x b=4 as 1 x b=8: loss $(json_num one.json loss_first) -> $(json_num one.json loss_last), \
held-out $(json_num one.json eval_loss) (alone) vs $(json_num two.json loss_first) -> $(json_num two.json loss_last), \
$(json_num two.json eval_loss)"
# shellcheck disable=SC2086
run2 "pretrain, 2 ranks, text" $P --batch 4
has "pretrain: the data-parallel line" stdout '^  data-parallel: 2 ranks over MPI, each b=4 of a global batch of 8'
has "pretrain: the reduction's time" stdout '^gradient sums over 2 ranks: [0-9.]+ ms/step at work, [0-9.]+ ms/step waited'
cases=$((cases + 1))
[ "$(grep -c '^step 6/6' stdout)" = 1 ] || fail "pretrain: the progress printed more than once (by every rank?)"

# --- resume: 2 ranks stopped at step 3 and resumed = 2 ranks straight through (bit for bit)
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, straight" $P --batch 4 --save straight.ckpt
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, until 3" $P --batch 4 --save resumed.ckpt --until 3
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, resumed" $P --batch 4 --save resumed.ckpt --resume resumed.ckpt
cases=$((cases + 1))
cmp -s straight.ckpt resumed.ckpt || fail "2 ranks resumed at step 3: the checkpoint differs from the straight run's"
echo "ok   pretrain: 2 ranks resumed at step 3 end bit-identical to the straight run"
# the same checkpoint, resumed alone with the global batch
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, until 3 (again)" $P --batch 4 --save mid.ckpt --until 3
# shellcheck disable=SC2086
good "pretrain alone, resumed from 2 ranks' checkpoint" $P --batch 8 --resume mid.ckpt --json
close "resumed alone: the last loss as the 2 ranks'" "$(json_num stdout loss_last)" "$(json_num two.json loss_last)" 1e-5
# shellcheck disable=SC2086
expect "a checkpoint of another global batch" 1 "batch" $P --batch 4 --resume mid.ckpt
# j = 33, not a multiple of 5: a sequence's share of the masked positions, ceil(33 / 5) = 7,
# the same on 2 ranks of b=4 as alone with b=8: the checkpoint resumes
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, j=33" $P --batch 4 --seq 33 --save odd.ckpt --until 2
# shellcheck disable=SC2086
good "resumed alone with b=8, j=33" $P --batch 8 --seq 33 --resume odd.ckpt

# --- ZeRO stage 1: the same run, the moments sharded; its checkpoint resumes alone
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, --zero 1" $P --batch 4 --zero 1 --json --save zero.ckpt
for k in loss_first loss_last eval_loss; do
    close "--zero 1: $k as without" "$(json_num stdout $k)" "$(json_num two.json $k)" 1e-5
done
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, --zero 1, the header" $P --batch 4 --zero 1 --steps 1
has "--zero 1: the header says so" stdout "the optimizer's moments sharded over the ranks \(ZeRO 1\)"
# shellcheck disable=SC2086
good "a --zero 1 checkpoint resumed alone" $P --batch 8 --steps 8 --resume zero.ckpt
echo "ok   --zero 1: the same losses, and a checkpoint that resumes alone"
# --- commands that run alone refuse a launch of several
cases=$((cases + 1))
$MPIRUN "$DMOVE" embed --help >stdout 2>stderr && fail "dmove embed under mpirun -np 2 was not refused"
grep -q 'only train and pretrain run data-parallel' stderr || fail "embed under mpirun: $(head -2 stderr)"

# --- train (the encoder stack on the teacher task): 2 ranks x b=4 against 1 x b=8
S="train --layers 2 --hidden 32 --heads 2 --ffn 64 --seq 16 --dropout 0 --steps 4 --lr 1e-3 --threads 1 --json"
# shellcheck disable=SC2086
good "train alone, b=8" $S --batch 8
sed -n 's/.*"loss":\[\([^]]*\)\].*/\1/p' stdout | tr ',' '\n' >one.loss
# shellcheck disable=SC2086
run2 "train, 2 ranks x b=4" $S --batch 4
sed -n 's/.*"loss":\[\([^]]*\)\].*/\1/p' stdout | tr ',' '\n' >two.loss
cases=$((cases + 1))
[ -s one.loss ] && paste one.loss two.loss | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1 }
    END { exit bad }' || fail "train: the losses of 2 ranks x b=4 differ from 1 x b=8: $(paste -d' ' one.loss two.loss)"
echo "ok   train: 2 ranks x b=4 as 1 x b=8: losses $(paste -d/ one.loss two.loss | tr '\n' ' ')"

# --- ranks launched differently refuse to start
cases=$((cases + 1))
# shellcheck disable=SC2086
mpirun -np 1 "$DMOVE" $P --batch 4 --lr 1e-3 : -np 1 "$DMOVE" $P --batch 4 --lr 2e-3 >stdout 2>stderr &&
    fail "ranks with different --lr started"
grep -q 'the ranks differ in --lr, from "0.001" (rank 0) against "0.002" (rank 1)' stderr ||
    fail "different options: the refusal does not say what differs: $(head -3 stderr)"
echo "ok   ranks with different options refused: $(grep -m1 'differ' stderr | cut -c1-150)..."
cases=$((cases + 1))
# shellcheck disable=SC2086
mpirun -np 1 "$DMOVE" $P --batch 4 --lr 1e-3 --steps 1 : -np 1 "$DMOVE" $P --steps=1 --lr 0.001 --batch 4 --lr 1e-3 \
    --threads 2 --log-every 1 >stdout 2>stderr ||
    fail "the same options in another order and spelling, another --threads, refused: $(grep -m1 differ stderr)"
echo "ok   the same options in another order, spelling and --threads: the ranks start"
cases=$((cases + 1))
# shellcheck disable=SC2086
mpirun -np 1 "$DMOVE" $P --batch 4 : -np 1 "$DMOVE" $P --batch 4 --pairs >stdout 2>stderr &&
    fail "ranks with and without --pairs started"
grep -q 'the ranks differ in the options given' stderr || fail "an option on one rank only: $(head -3 stderr)"
echo "ok   an option on one rank only refused: $(grep -m1 'differ' stderr | cut -c1-120)..."

# the same options and paths, other token data of the same size and vocabulary (each rank in
# its own working directory): refused, naming the data
mkdir -p w0 w1 && cp vocab.txt w0/ && cp vocab.txt w1/ && cp -r data w0/data
sed 's/cat/dog/' corpus.txt >w1/corpus.txt
(cd w1 && "$DMOVE" prepare --tokenizer vocab.txt --lowercase --out data --valid-fraction 0.1 corpus.txt >/dev/null 2>&1) ||
    fail "prepare in w1"
cases=$((cases + 1))
# shellcheck disable=SC2086
mpirun -np 1 -wdir "$PWD/w0" "$DMOVE" $P --batch 4 --steps 1 : -np 1 -wdir "$PWD/w1" "$DMOVE" $P --batch 4 --steps 1 \
    >stdout 2>stderr && fail "ranks with other token data started"
grep -q 'the ranks differ in the training data' stderr || fail "other data: the refusal does not say so: $(head -3 stderr)"
echo "ok   ranks with other token data (same size, same vocabulary) refused"
# each rank its own copy of the checkpoint to resume, one stale (an earlier step): refused
# before any step, naming what differs (a step count not shared ended inside MPI before)
rm -rf w1/data && cp -r data w1/data && cp mid.ckpt w0/r.ckpt || fail "copies for the resume"
# shellcheck disable=SC2086
run2 "pretrain 2 ranks, until 2" $P --batch 4 --save w1/r.ckpt --until 2
cases=$((cases + 1))
# shellcheck disable=SC2086
mpirun -np 1 -wdir "$PWD/w0" "$DMOVE" $P --batch 4 --resume r.ckpt : -np 1 -wdir "$PWD/w1" "$DMOVE" $P --batch 4 \
    --resume r.ckpt >stdout 2>stderr && fail "ranks resuming other checkpoints started"
grep -q 'the ranks differ in the checkpoint to resume' stderr && grep -q 'step 3, parameters' stderr ||
    fail "other checkpoints: the refusal does not say so: $(head -3 stderr)"
echo "ok   ranks resuming other checkpoints (steps 3 and 2) refused: $(grep -m1 'differ' stderr | cut -c1-110)..."
# a wait the ranks cannot take: refused, not the default ten minutes
cases=$((cases + 1))
# shellcheck disable=SC2086
DMOVE_DIST_TIMEOUT=3s $MPIRUN -x DMOVE_DIST_TIMEOUT "$DMOVE" $P --batch 4 --steps 1 >stdout 2>stderr &&
    fail "DMOVE_DIST_TIMEOUT=3s was taken"
grep -q "DMOVE_DIST_TIMEOUT='3s'" stderr || fail "DMOVE_DIST_TIMEOUT=3s: the refusal does not name it: $(head -3 stderr)"

# --- faults: the pid of rank 1 of the run in the background
rank1() {
    for p in $(pgrep -f "$DMOVE pretrain"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$' && echo "$p"
    done
}
LONG0="$P --batch 4 --steps 1000000 --eval-every 1000000 --save long.ckpt"
LONG="$LONG0 --save-every 20"
wait_for_ckpt() {
    i=0
    while [ ! -s long.ckpt ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
}
# fault NAME SIG [MPIRUN-OPTIONS...]: the long run in the background, rank 1 sent SIG once a
# checkpoint exists; then rc (the job's status) and t (seconds from the signal to its end)
# are set; 1 (and the job stopped) if rank 1 was not found
fault() {
    name=$1 sig=$2
    shift 2
    rm -f long.ckpt
    # shellcheck disable=SC2086
    $MPIRUN "$@" "$DMOVE" $LONG >stdout 2>stderr &
    job=$!
    wait_for_ckpt
    p=$(rank1)
    cases=$((cases + 1))
    if [ -z "$p" ]; then
        fail "$name: rank 1 not found"
        kill "$job"
        return 1
    fi
    kill -"$sig" "$p"
    t0=$(date +%s)
    # a job still running after 120 s has failed: ended, not waited for (the default wait
    # for a rank is an hour while rank 0 writes a checkpoint)
    (
        sleep 120 &
        s=$!
        trap 'kill "$s" 2>/dev/null; exit 0' TERM # ended with the job: its sleep too
        wait "$s"
        kill -CONT "$p" 2>/dev/null
        kill "$job" 2>/dev/null
    ) &
    watchdog=$!
    wait "$job"
    rc=$?
    t=$(($(date +%s) - t0))
    kill "$watchdog" 2>/dev/null
    [ "$rc" -ne 0 ] && [ "$t" -lt 60 ] || fail "$name: exit $rc after $t s"
}
# a rank that hangs: the other stops after the timeout, naming it
export DMOVE_DIST_TIMEOUT=3
if fault hang STOP -x DMOVE_DIST_TIMEOUT; then
    grep -Eq 'rank 0 of 2 waited 3 s for the other ranks .*rank 1 (is behind|does not answer|is in it too, but has not moved)' stderr ||
        fail "hang: no message naming rank 1: $(grep -m2 rank stderr)"
    echo "ok   a hung rank stops the run in $t s: $(grep -m1 'waited' stderr | cut -c1-200)"
fi
# the same while rank 0 writes a checkpoint: rank 0, the file written, waits the ordinary
# time for the others (they wait an hour for it). A checkpoint every step, of 21 MB, and
# little work a step (b=1, j=8): rank 1 is mostly stopped in that wait; up to 4 tries
LONG="$(echo "$P" | sed 's/--hidden 32 --heads 2 --ffn 64 --seq 32/--hidden 256 --heads 2 --ffn 1024 --seq 8/') \
--batch 1 --steps 1000000 --eval-every 1000000 --save long.ckpt --save-every 1"
try=0
while [ $try -lt 4 ]; do
    try=$((try + 1))
    fault "hang while rank 0 writes" STOP -x DMOVE_DIST_TIMEOUT || break
    grep -Eq 'rank 0 of 2 waited 3 s for the other ranks .*rank 1 (is behind|does not answer|is in it too, but has not moved)' stderr ||
        { fail "hang while rank 0 writes: no message naming rank 1: $(grep -m2 rank stderr)"; break; }
    if grep -q 'waited 3 s for the other ranks (rank 0 writing the file)' stderr; then
        echo "ok   a rank hung while rank 0 writes stops the run in $t s (try $try): $(grep -m1 'waited' stderr | cut -c1-120)"
        break
    fi
    [ $try -lt 4 ] || fail "hang while rank 0 writes: 4 tries, rank 1 never stopped in the write: $(grep -m1 waited stderr)"
done
LONG="$LONG0 --save-every 20"
unset DMOVE_DIST_TIMEOUT
good "hang: the last checkpoint is whole" export --checkpoint long.ckpt --out after-hang
# a rank that dies: mpirun ends the job, naming it
if fault kill KILL; then
    grep -q 'rank 1' stderr || fail "kill: nothing names rank 1: $(tail -3 stderr)"
    echo "ok   a killed rank ends the job in $t s: $(grep -m1 'rank 1' stderr)"
fi
good "kill: the last checkpoint is whole" export --checkpoint long.ckpt --out after-kill
# Ctrl-C on mpirun (SIGINT to every rank): they stop after the same step and save
rm -f long.ckpt
# shellcheck disable=SC2086
$MPIRUN "$DMOVE" $LONG >stdout 2>stderr &
job=$!
wait_for_ckpt
kill -INT "$job"
wait "$job"
cases=$((cases + 1))
n0=$(sed -n 's/^rank 0: .*interrupted after step \([0-9]*\): checkpoint saved.*/\1/p' stderr)
n1=$(sed -n 's/^rank 1: .*interrupted after step \([0-9]*\): checkpoint saved.*/\1/p' stderr)
if [ -z "$n0" ] || [ "$n0" != "$n1" ]; then
    fail "Ctrl-C: the ranks did not stop after the same step: '$n0' '$n1'"
elif grep -q MPI_ABORT stderr; then
    fail "Ctrl-C: the job was aborted, not ended"
else
    echo "ok   Ctrl-C on mpirun: both ranks stop after step $n0 and save"
fi
# shellcheck disable=SC2086
run2 "Ctrl-C: the checkpoint resumes" $P --batch 4 --steps $((n0 + 2)) --resume long.ckpt

echo "test_dist_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
