# quiet.sh: sourced by the bench scripts. Other jobs on a 2-core machine distort every
# number: each run waits (up to 120 s) for an idle machine, then runs under bench/watch.py,
# which counts the CPU time everyone else used meanwhile; a run during which others used
# more than 5% of a CPU is repeated, up to 4 tries. Counters waited/repeats/noisy are for
# the report.
# Needs: root (the repository), quiet_name (for messages), quiet_py (a python3),
# wait_idle (1: check, 0: just run).
waited=0; repeats=0; noisy=0
wait_quiet() {
    [ "$wait_idle" -eq 1 ] || return 0
    n=0
    while [ "$n" -lt 120 ]; do
        [ "$("$quiet_py" "$root/bench/watch.py" idle)" -lt 10 ] && return 0
        n=$((n + 1)); waited=$((waited + 1))
    done
    echo "$quiet_name: machine still busy after 120 s, running anyway" >&2
}
# clean_run OUT CMD...: run CMD (stdout to OUT) until no other job interfered; 1 if it failed.
clean_run() {
    out_file=$1; shift
    try=1
    while :; do
        wait_quiet
        foreign=$("$quiet_py" "$root/bench/watch.py" "$out_file" "$@") || return 1
        if [ "$wait_idle" -eq 0 ] || awk -v f="$foreign" 'BEGIN{exit !(f < 0.05)}'; then return 0; fi
        if [ "$try" -ge 4 ]; then noisy=$((noisy + 1)); echo "  still disturbed after $try tries (others used $foreign CPUs): kept" >&2; return 0; fi
        echo "  others used $foreign CPUs during the run: repeating it" >&2
        try=$((try + 1)); repeats=$((repeats + 1))
    done
}
