#!/bin/sh
# tests/soak.sh [DMOVE]: a soak run of `dmove train` (make soak; not part of make test).
#  1. An uninterrupted run of SOAK_STEPS (2000) steps of a small stack, its RSS sampled.
#  2. The same run interrupted, SOAK_ROUNDS (3) times: another loop sends SIGINT, SIGTERM or SIGHUP (now and
#     then two at once: the second ends the run at once) at random moments and restarts it
#     with --resume (same options) until it reaches the last step. Its final checkpoint
#     must be byte-identical to the uninterrupted run's (tensors and metadata), and no
#     temporary file may be left beside it.
#  3. A long uninterrupted run (SOAK_LONG_STEPS, 20000 steps), RSS sampled from
#     /proc/PID/status every 50 ms: the last quarter's median RSS may exceed the first
#     quarter's by at most the run's loss and step-time history (16 bytes a step, kept
#     for the summary and --svg; 32 with the array's doubling) plus SOAK_RSS_SLACK_KB
#     (1024).
#  4. A shorter interrupted run (SOAK_ASAN_STEPS, 600) under the ASan build
#     (SOAK_ASAN_DMOVE, build-asan/dmove: `make test-asan` builds it) with leak checking:
#     no report from ASan, LeakSanitizer or UBSan, and byte-identical to the same build's
#     uninterrupted run. Skipped, saying so, when that binary is missing.
# SOAK_SEED picks the signal moments (default: the time); the summary prints it.
set -u
DMOVE=${1:-${DMOVE:-build/dmove}}
STEPS=${SOAK_STEPS:-2000}
LONG=${SOAK_LONG_STEPS:-20000}
ASTEPS=${SOAK_ASAN_STEPS:-600}
ADMOVE=${SOAK_ASAN_DMOVE:-build-asan/dmove}
SLACK=${SOAK_RSS_SLACK_KB:-1024}
ROUNDS=${SOAK_ROUNDS:-3}
SEED=${SOAK_SEED:-$(date +%s)}
OPTS="--layers 2 --hidden 32 --heads 2 --ffn 64 --seq 16 --batch 4 --lr 3e-4 --warmup 20 --lr-schedule linear"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -x "$DMOVE" ] || { echo "soak: $DMOVE not found: build it (make) or give its path" >&2; exit 2; }
DIR=$(mktemp -d "${TMPDIR:-/tmp}/dmove-soak.XXXXXX") || exit 2
trap 'rm -rf "$DIR"' EXIT
fail=0
bad() { echo "soak: FAIL: $*"; fail=1; }

# rnd K N: a number in [0, N) from the seed and K (md5 of both: awk's srand on
# neighbouring seeds gives neighbouring numbers)
rnd() { echo $(( $(printf '%d' "0x$(echo "$SEED $1" | md5sum | cut -c1-7)") % $2 )); }

# sample PID FILE: VmRSS (kB) every 50 ms while PID lives
sample() {
    while [ -r /proc/$1/status ]; do
        awk '/^VmRSS:/ { print $2 }' /proc/$1/status 2>/dev/null >> "$2"
        sleep 0.05
    done
}

# rss_report FILE WHAT STEPS [report]: first/last quarter medians, max; fails past the
# history + slack (not with "report": ASan's quarantine holds freed memory by design)
rss_report() {
    med='{ a[NR] = $1 } END { print NR ? a[int((NR + 1) / 2)] : 0 }'
    n=$(wc -l < "$1")
    [ "$n" -ge 8 ] || { echo "soak: $2: only $n RSS samples"; return; }
    q=$((n / 4))
    first=$(head -n "$q" "$1" | sort -n | awk "$med")
    last=$(tail -n "$q" "$1" | sort -n | awk "$med")
    max=$(sort -n "$1" | tail -n 1)
    hist=$(($3 * 32 / 1024))
    echo "soak: $2: RSS $n samples: first quarter median $first kB, last quarter median $last kB (+$((last - first)) kB; the history's bound $hist kB), max $max kB"
    [ "${4:-}" = report ] || [ $((last - first)) -le $((hist + SLACK)) ] || bad "$2: RSS grew by $((last - first)) kB (over $hist + $SLACK kB)"
}

# plain BIN STEPS CKPT RSSFILE: an uninterrupted run
plain() {
    "$1" train $OPTS --steps "$2" --save "$3" > "$DIR/plain.out" 2>&1 &
    pid=$!
    sample $pid "$4" &
    spid=$!
    wait $pid
    rc=$?
    wait $spid
    [ $rc = 0 ] || { bad "uninterrupted run of $2 steps: status $rc"; tail -n 5 "$DIR/plain.out"; }
    if grep -q -E 'Sanitizer|runtime error' "$DIR/plain.out"; then bad "sanitizer report"; cat "$DIR/plain.out"; fi
}

# interrupted BIN STEPS CKPT MAXDELAY_MS KEY: runs until the last step, signalled at random
# (moments from the seed and KEY)
interrupted() {
    bin=$1 n=$2 ck=$3 maxd=$4 k=$5 sigs=0 doubles=0 saved=0 starts=0
    rm -f "$ck"
    while :; do
        k=$((k + 1)) starts=$((starts + 1))
        [ $starts -le 1000 ] || { bad "interrupted run: 1000 restarts without reaching step $n"; return; }
        res=
        [ -e "$ck" ] && res="--resume $ck"
        "$bin" train $OPTS --steps "$n" --save-every 50 --save "$ck" $res > "$DIR/int.out" 2>&1 &
        pid=$!
        d=$(rnd $k "$maxd")
        sleep "$(awk -v d="$d" 'BEGIN { printf "%.3f", d / 1000 }')"
        case $(rnd $((k + 100000)) 3) in 0) sig=INT ;; 1) sig=TERM ;; *) sig=HUP ;; esac
        dbl=$(rnd $((k + 200000)) 4) # 0: a second signal right behind the first
        if kill -s $sig $pid 2>/dev/null; then
            sigs=$((sigs + 1))
            [ "$dbl" = 0 ] && kill -s $sig $pid 2>/dev/null && doubles=$((doubles + 1))
        fi
        wait $pid 2>/dev/null
        rc=$?
        if grep -q -E 'Sanitizer|runtime error' "$DIR/int.out"; then bad "sanitizer report (start $starts)"; cat "$DIR/int.out"; return; fi
        grep -q '^checkpoint:' "$DIR/int.out" && saved=$((saved + 1))
        case $rc in
        0) break ;;
        129 | 130 | 143) ;;
        2) grep -q 'already at --steps' "$DIR/int.out" && break
           bad "start $starts: status 2"; cat "$DIR/int.out"; return ;;
        *) bad "start $starts: status $rc"; cat "$DIR/int.out"; return ;;
        esac
    done
    left=$(ls "$ck".tmp.* 2>/dev/null | wc -l)
    [ "$left" = 0 ] || bad "$left temporary files left beside the checkpoint"
    echo "soak: interrupted run of $n steps: $starts starts, $sigs signals ($doubles followed by a second at once); $((starts - saved)) runs ended without a checkpoint of their own (the second signal, or one before the handlers)"
}

# same A B WHAT: byte-identical checkpoints, else what differs
same() {
    if cmp -s "$1" "$2"; then
        echo "soak: $3: the final checkpoints are byte-identical ($(wc -c < "$1") bytes: every tensor and the metadata)"
    else
        bad "$3: the final checkpoints differ"
        command -v python3 >/dev/null && python3 - "$1" "$2" <<'PY'
import json, struct, sys
def rd(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    return h, b[8 + n:]
(ha, da), (hb, db) = rd(sys.argv[1]), rd(sys.argv[2])
print('metadata differs:', {k: (ha['__metadata__'].get(k), hb['__metadata__'].get(k)) for k in
      set(ha['__metadata__']) | set(hb['__metadata__']) if ha['__metadata__'].get(k) != hb['__metadata__'].get(k)})
for k in sorted(set(ha) - {'__metadata__'}):
    if k in hb:
        a0, a1 = ha[k]['data_offsets']; b0, b1 = hb[k]['data_offsets']
        if da[a0:a1] != db[b0:b1]: print('tensor differs:', k)
PY
    fi
}

echo "soak: $DMOVE, $OPTS; seed $SEED"
t0=$(date +%s)
plain "$DMOVE" "$STEPS" "$DIR/ref.ckpt" "$DIR/rss_ref"
rss_report "$DIR/rss_ref" "uninterrupted $STEPS steps" "$STEPS"
r=0
while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    interrupted "$DMOVE" "$STEPS" "$DIR/int.ckpt" 250 $((r * 10000))
    same "$DIR/ref.ckpt" "$DIR/int.ckpt" "round $r: interrupted vs uninterrupted, $STEPS steps"
done
plain "$DMOVE" "$LONG" "$DIR/long.ckpt" "$DIR/rss_long"
rss_report "$DIR/rss_long" "uninterrupted $LONG steps" "$LONG"
if [ -x "$ADMOVE" ]; then
    export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
    plain "$ADMOVE" "$ASTEPS" "$DIR/aref.ckpt" "$DIR/rss_asan"
    rss_report "$DIR/rss_asan" "ASan uninterrupted $ASTEPS steps (RSS not checked: ASan's quarantine)" "$ASTEPS" report
    interrupted "$ADMOVE" "$ASTEPS" "$DIR/aint.ckpt" 1000 0
    same "$DIR/aref.ckpt" "$DIR/aint.ckpt" "ASan build, interrupted vs uninterrupted, $ASTEPS steps"
else
    echo "soak: SKIPPED the ASan part: $ADMOVE not found (make test-asan builds it)"
fi
echo "soak: $(($(date +%s) - t0)) s; seed $SEED"
[ $fail = 0 ] && echo "soak: passed"
exit $fail
