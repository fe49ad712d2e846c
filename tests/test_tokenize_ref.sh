#!/bin/sh
# test_tokenize_ref.sh: `dmove tokenize` gives the ids of transformers' BertTokenizerFast.
# For every reference tests/text/refs/<tokenizer>@<mode>/<corpus>.sums (made by
# tests/text/make_refs.py: of the "<count> <FNV-1a 64>" line per input line, per chunk of 1000
# lines their count, ids and md5) it runs
#   dmove tokenize --tokenizer tests/text/tok/<tokenizer> [--lowercase|--cased] --digest CORPUS
# on tests/text/corpus/<corpus>.txt.gz decompressed (gzip -dc), sums its output the same way
# and compares chunk by chunk; on a difference it names the chunks' lines, shows dmove's digests
# there, and the command that prints the reference digests of those lines. Then a BPE and a Unigram
# tokenizer.json must be refused (naming WordPiece), and invalid UTF-8 must stop with a
# message naming the file and the byte offset; and a few generated files (a 6 MB line, a 6 MB
# word, no final newline, empty lines, an empty file) must give their known digests. Prints per
# tokenizer the lines and ids that agree. Needs no Python.
# Usage: DMOVE=build/dmove sh tests/test_tokenize_ref.sh [NAME...]
#        (NAME: only the references whose <tokenizer>@<mode>/<corpus> path contains NAME;
#        "threads", "refusal", "utf8", "edge": those checks)
set -u

DMOVE=${DMOVE:?set DMOVE to the dmove binary, e.g. DMOVE=build/dmove}
case $DMOVE in /*) ;; *) DMOVE=$(pwd)/$DMOVE ;; esac
[ -x "$DMOVE" ] || { echo "test_tokenize_ref.sh: $DMOVE is not an executable" >&2; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
TEXT=$HERE/text
[ -d "$TEXT/refs" ] || { echo "test_tokenize_ref.sh: no $TEXT/refs" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/dmove_tokref.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM
cases=0
fails=0
SHOW=5 # differing lines shown per pair

fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

selected() { # selected PATH: no NAME given, or PATH contains one
    [ $# -gt 1 ] || return 0
    p=$1
    shift
    for n in "$@"; do
        case $p in *"$n"*) return 0 ;; esac
    done
    return 1
}

mode_flag() { # the dmove flag of a reference directory's mode
    case $1 in
        json) echo "" ;;
        lower) echo "--lowercase" ;;
        cased) echo "--cased" ;;
        *) echo "?" ;;
    esac
}

# sums_of DIGESTS OUT: the reference format (make_refs.py's sums_text) of a --digest output:
# a header, then per chunk of 1000 lines its first line, lines, ids and md5 (md5sum's).
sums_of() {
    rm -f "$T"/chunk.*
    awk '{ n++; ids += $1 } END { printf "# lines %d ids %d chunk 1000\n", n, ids }' "$1" >"$2"
    [ -s "$1" ] || return 0
    split -l 1000 -a 6 -d "$1" "$T/chunk."
    awk '{ k = int((NR - 1) / 1000); if (!(k in first)) { first[k] = NR; order[++m] = k } n[k]++; ids[k] += $1 }
         END { for (i = 1; i <= m; i++) { k = order[i]; print first[k], n[k], ids[k] } }' "$1" >"$T/chunks"
    md5sum "$T"/chunk.* | cut -d' ' -f1 | paste -d' ' "$T/chunks" - >>"$2"
}

# check_pair DIR SUMS: one reference (DIR/<corpus>.sums) against dmove.
check_pair() {
    dir=$1
    ref=$2
    corpus=$(basename "$ref" .sums).txt.gz
    name=${dir##*/}
    tok=${name%@*}
    mode=${name##*@}
    flag=$(mode_flag "$mode")
    cases=$((cases + 1))
    in=$T/corpus.$corpus
    [ -f "$in" ] || gzip -dc "$TEXT/corpus/$corpus" >"$in" ||
        { fail "$name/$corpus: cannot decompress tests/text/corpus/$corpus"; return; }
    # shellcheck disable=SC2086 # $flag is one word or none
    "$DMOVE" tokenize --tokenizer "$TEXT/tok/$tok" $flag --digest "$in" >"$T/out" 2>"$T/err"
    rc=$?
    sums_of "$T/out" "$T/mine"
    # agreeing lines and ids (those of the chunks that agree), all lines and ids
    # shellcheck disable=SC2046 # four numbers
    set -- $(awk 'NR == FNR { if ($1 != "#") ref[$1] = $0; else { n = $3; ids = $5 } next }
                  $1 != "#" && ($1 in ref) && ref[$1] == $0 { ok += $2; okids += $3 }
                  END { printf "%d %d %d %d\n", ok, n, okids, ids }' "$ref" "$T/mine")
    ok=$1 lines=$2 okids=$3 ids=$4
    printf '%-40s %-26s lines %7d/%-7d ids %8d/%-8d\n' "$name" "$corpus" "$ok" "$lines" "$okids" "$ids"
    echo "$name $ok $lines $okids $ids" >>"$T/sums"
    if [ "$rc" -ne 0 ]; then
        fail "$name/$corpus: dmove exited $rc: $(head -c 400 "$T/err")"
    fi
    if [ "$ok" -eq "$lines" ] && cmp -s "$ref" "$T/mine"; then
        return
    fi
    [ "$rc" -ne 0 ] || fail "$name/$corpus: $((lines - ok)) of $lines lines are in chunks that differ"
    # the first two chunks that differ: their lines, dmove's first digests, and the command that
    # prints the reference digests of those lines
    awk 'NR == FNR { if ($1 != "#") ref[$1] = $0; next }
         $1 != "#" && (!($1 in ref) || ref[$1] != $0) { print $1, $2; if (++k == 2) exit }' "$ref" "$T/mine" >"$T/bad"
    while read -r first n; do
        echo "  lines $first-$((first + n - 1)) of $corpus differ; dmove's first digests there:" >&2
        sed -n "${first},$((first + SHOW - 1))p" "$T/out" | sed 's/^/    /' >&2
        echo "    reference digests: python3 tests/text/make_refs.py --digests $tok@$mode $corpus $first $n" >&2
        echo "    one line's ids: python3 tests/text/make_refs.py --show $tok@$mode $corpus LINE" >&2
    done <"$T/bad"
}

for dir in "$TEXT"/refs/*@*; do
    [ -d "$dir" ] || continue
    for sums in "$dir"/*.sums; do
        [ -f "$sums" ] || continue
        selected "${dir##*/}/$(basename "$sums" .sums)" "$@" || continue
        check_pair "$dir" "$sums"
    done
done

if [ -f "$T/sums" ]; then
    echo "agreement per tokenizer (lines, ids on the agreeing lines):"
    awk '{ ok[$1] += $2; n[$1] += $3; oki[$1] += $4; ni[$1] += $5; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
         END { for (i = 1; i <= k; i++) { t = order[i]
                 printf "  %-40s lines %8d/%-8d (%.4f%%)  ids %9d/%-9d (%.4f%%)\n", t, ok[t], n[t],
                        100 * ok[t] / (n[t] ? n[t] : 1), oki[t], ni[t], 100 * oki[t] / (ni[t] ? ni[t] : 1) } }' "$T/sums"
fi

# The output must not depend on the number of threads: one reference again at 1 and 3 threads.
if selected threads "$@"; then
    for th in 1 3; do
        cases=$((cases + 1))
        gzip -dc "$TEXT/corpus/iso-codes.txt.gz" >"$T/threads.txt"
        "$DMOVE" tokenize --tokenizer "$TEXT/tok/wp-cased.json" --digest --threads $th "$T/threads.txt" \
            >"$T/out" 2>"$T/err"
        sums_of "$T/out" "$T/mine"
        cmp -s "$TEXT/refs/wp-cased.json@json/iso-codes.sums" "$T/mine" ||
            fail "--threads $th: the digests of iso-codes.txt differ from the reference: $(head -c 300 "$T/err")"
    done
fi

# refused NAME FILE WORD: a tokenizer.json of another model must be refused, naming WORD and
# WordPiece (what is supported).
refused() {
    cases=$((cases + 1))
    echo "hello world" | "$DMOVE" tokenize --tokenizer "$2" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -ne 1 ]; then
        fail "$1: a $3 tokenizer.json: exit $rc, expected 1: $(head -c 300 "$T/err")"
    elif ! grep -qi "$3" "$T/err" || ! grep -qi wordpiece "$T/err"; then
        fail "$1: the message should name $3 and WordPiece: $(head -c 300 "$T/err")"
    fi
}
if selected refusal "$@"; then
    refused bpe "$TEXT/tok/bpe.json" BPE
    refused unigram "$TEXT/tok/unigram.json" Unigram
fi

# bad_utf8 NAME OFFSET BYTES: a file of the printf BYTES must stop dmove (exit 1) with a
# message naming the file and the byte offset OFFSET of the first invalid byte in the file.
bad_utf8() {
    cases=$((cases + 1))
    f=$T/bad_$1.txt
    # shellcheck disable=SC2059 # the bytes are written as printf escapes
    printf "$3" >"$f"
    "$DMOVE" tokenize --tokenizer "$TEXT/tok/bert-base-uncased.json" --digest "$f" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -ne 1 ]; then
        fail "invalid UTF-8 ($1): exit $rc, expected 1: $(head -c 300 "$T/err")"
    elif ! grep -q "bad_$1.txt" "$T/err" || ! grep -Eq "(^|[^0-9])$2([^0-9]|\$)" "$T/err"; then
        fail "invalid UTF-8 ($1): the message should name bad_$1.txt and byte offset $2: $(head -c 300 "$T/err")"
    fi
}
if selected utf8 "$@"; then
    bad_utf8 ff 13 'good line\nabc\377 def\n'
    bad_utf8 overlong 6 'caf\303\251 \300\257 x\n'
    bad_utf8 surrogate 2 'a \355\240\200 b\n'
    bad_utf8 above_max 16 'line one\nline 2 \364\220\200\200\n'
    bad_utf8 lone_continuation 0 '\200abc\n'
    bad_utf8 truncated_at_end 12 'ok\nlast one \344\270'
fi

# edge NAME EXPECTED: the digest output of $T/edge.txt must be EXPECTED (bert-base-uncased.json;
# the digests computed with make_refs.py's load() and fnv1a64() on the same text).
edge() {
    cases=$((cases + 1))
    "$DMOVE" tokenize --tokenizer "$TEXT/tok/bert-base-uncased.json" --digest "$T/edge.txt" \
        >"$T/out" 2>"$T/err"
    rc=$?
    got=$(cat "$T/out")
    if [ "$rc" -ne 0 ] || [ "$got" != "$2" ]; then
        fail "$1: exit $rc, digest '$(head -c 200 "$T/out")', expected '$2': $(head -c 300 "$T/err")"
    fi
}
if selected edge "$@"; then
    awk 'BEGIN { for (i = 0; i < 3000000; i++) printf "a "; printf "\n" }' >"$T/edge.txt"
    edge "a 6 MB line of 3000000 words" "3000002 16013a6ca3864286"
    awk 'BEGIN { for (i = 0; i < 2000000; i++) printf "x\303\251"; printf "\r\n" }' >"$T/edge.txt"
    edge "a 6 MB word (CRLF)" "3 9122f2957e121422"
    printf 'hello world' >"$T/edge.txt"
    edge "no newline at the end" "4 60d77b51b1d2dd61"
    printf '\n\r\n' >"$T/edge.txt"
    edge "empty lines" "2 adc57d4d8de1e486
2 adc57d4d8de1e486"
    : >"$T/edge.txt"
    edge "an empty file" ""
fi

echo "test_tokenize_ref.sh: $((cases - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
