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
