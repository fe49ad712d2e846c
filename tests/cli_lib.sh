# cli_lib.sh: what the command-line test scripts share. Sourced (not run by `make test`: its
# name is not test_*), as
#     . "$(dirname "$0")/cli_lib.sh"
#     cli_setup test_x.sh dmove_x
# which resolves DMOVE (the binary under test, from the environment) to an absolute path and
# checks it, makes the temporary directory $T (removed at exit, and on INT/TERM), and starts
# the counters `cases` and `fails` that fail() counts.

cli_setup() { # cli_setup SCRIPT PREFIX
    DMOVE=${DMOVE:?set DMOVE to the dmove binary, e.g. DMOVE=build/dmove}
    case $DMOVE in /*) ;; *) DMOVE=$(pwd)/$DMOVE ;; esac
    [ -x "$DMOVE" ] || { echo "$1: $DMOVE is not an executable" >&2; exit 1; }
    T=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX") || exit 1
    trap 'rm -rf "$T"' EXIT
    trap 'exit 1' INT TERM
    cases=0
    fails=0
}

fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

# The scripts that run in $T (cd "$T"): dmove's output goes to ./stdout and ./stderr.
# good NAME ARGS...: dmove ARGS must exit 0.
good() {
    name=$1
    shift
    cases=$((cases + 1))
    "$DMOVE" "$@" >stdout 2>stderr
    rc=$?
    [ "$rc" -eq 0 ] || { fail "$name: exit $rc (dmove $*)"; sed 's/^/    /' stderr >&2; }
}

# expect NAME CODE PATTERN ARGS...: dmove ARGS must exit CODE with PATTERN (grep -E) on
# stderr; returns 0 when it does.
expect() {
    name=$1 want=$2 pat=$3
    shift 3
    cases=$((cases + 1))
    "$DMOVE" "$@" >stdout 2>stderr
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit $rc, expected $want (dmove $*)"
    elif ! grep -Eq -- "$pat" stderr; then
        fail "$name: stderr lacks /$pat/"
    else
        return 0
    fi
    sed 's/^/    /' stderr >&2
    return 1
}

# has NAME FILE PATTERN: FILE matches PATTERN (grep -E).
has() {
    cases=$((cases + 1))
    grep -Eq -- "$3" "$2" || { fail "$1: $2 lacks /$3/"; sed 's/^/    /' "$2" >&2; }
}

# same_on_cuda NAME FILE SAME COMMAND ARGS...: dmove COMMAND --device cuda ARGS, emulated on
# the host (DMOVE_CUDA_EMULATE=1), must exit 0 with `SAME FILE` true (FILE: stdout or
# stderr; SAME: the script's comparison with the CPU run's results); SKIP (status 1) where
# dmove is built without CUDA.
same_on_cuda() {
    name=$1 file=$2 same=$3 cmd=$4
    shift 4
    DMOVE_CUDA_EMULATE=1 "$DMOVE" "$cmd" --device cuda "$@" >stdout 2>stderr
    rc=$?
    if grep -q "built without CUDA" stderr; then
        echo "SKIP $name: $(head -1 stderr)"
        return 1
    fi
    cases=$((cases + 1))
    if [ "$rc" -eq 0 ] && "$same" "$file"; then
        echo "ok   $name: the CPU's results"
    else
        fail "$name: exit $rc, not the CPU's results"
        sed 's/^/    /' stderr stdout >&2
    fi
}
