#!/bin/sh
# skips.sh LOGDIR: what the suite skipped and why, from the tests' SKIP lines (a check that
# needs AVX2 or AVX-512, a GPU, or a backend this build lacks), counted by test; the end of
# `make test` prints it so that a skipped check is never silent.
dir=${1:?usage: skips.sh LOGDIR}
n=$(cat "$dir"/*.log 2>/dev/null | grep -c 'SKIP')
if [ "$n" = 0 ]; then
    echo "skipped: nothing"
    exit 0
fi
echo "skipped: $n checks or suites (they need what this machine or build lacks):"
for f in "$dir"/*.log; do
    grep 'SKIP' "$f" | sed -e 's/^ *//' -e "s|^|$(basename "$f" .log): |"
done | sort | uniq -c | sed 's/^ *\([0-9]*\) /  \1x /'
