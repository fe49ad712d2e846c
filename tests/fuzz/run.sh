#!/bin/sh
# tests/fuzz/run.sh SECONDS JOBS NAME...: runs build-fuzz/fuzz/fuzz_NAME for SECONDS each,
# JOBS at a time (make fuzz: FUZZ_SECONDS, FUZZ_JOBS), from its seed corpus
# tests/fuzz/corpus/NAME; what it finds new goes to build-fuzz/corpus/NAME, a crashing
# input to build-fuzz/artifacts/NAME-*, the log to build-fuzz/fuzz_NAME.log. Prints each
# harness's executions and coverage (libFuzzer's cov: edges, ft: features) and fails when
# any harness found a crash, a leak, undefined behaviour or a timeout.
set -u
secs=$1 jobs=$2
shift 2
one() {
    n=$1 secs=$2
    mkdir -p build-fuzz/corpus/$n build-fuzz/artifacts
    OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-fuzz/fuzz/fuzz_$n \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix=build-fuzz/artifacts/$n- build-fuzz/corpus/$n tests/fuzz/corpus/$n \
        > build-fuzz/fuzz_$n.log 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' build-fuzz/fuzz_$n.log)
    last=$(grep -E '^#[0-9]+' build-fuzz/fuzz_$n.log | tail -n 1)
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
    if [ $rc = 0 ]; then
        echo "fuzz_$n: ${secs} s, ${execs:-?} executions, cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?}: no crash, leak or UB"
    else
        echo "fuzz_$n: FAILED (status $rc) after ${execs:-?} executions: build-fuzz/fuzz_$n.log, input in build-fuzz/artifacts/"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' build-fuzz/fuzz_$n.log | head -n 8
        return 1
    fi
}
fails=0
if [ "$jobs" -le 1 ]; then
    for n in "$@"; do one "$n" "$secs" || fails=$((fails + 1)); done
else
    # JOBS lanes, each taking every JOBS-th harness in turn
    lane=0 pids=
    while [ $lane -lt "$jobs" ]; do
        (
            k=0 f=0
            for n in "$@"; do
                [ $((k % jobs)) = $lane ] && { one "$n" "$secs" || f=1; }
                k=$((k + 1))
            done
            exit $f
        ) &
        pids="$pids $!"
        lane=$((lane + 1))
    done
    for p in $pids; do wait $p || fails=$((fails + 1)); done
fi
[ $fails = 0 ] && echo "fuzzing: $# harnesses, $secs s each: no crash, leak, UB or timeout"
[ $fails = 0 ]
