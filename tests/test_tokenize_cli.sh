#!/bin/sh
# test_tokenize_cli.sh: `dmove tokenize` end to end on a small vocab.txt and tokenizer.json
# written here: ids, --tokens, --digest (the agreed format: "COUNT HASH", FNV-1a 64 of the
# ids as little-endian int32), --no-special, CRLF lines, a last line without "\n", several
# files and stdin, the same output on 1 and 3 threads, and the errors: invalid UTF-8 (file,
# byte offset, line; exit 1), a BPE tokenizer.json refused, usage errors (exit 2).
# Usage: DMOVE=build/dmove sh tests/test_tokenize_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_tokenize_cli.sh dmove_tok

# same NAME WANT GOT
same() {
    cases=$((cases + 1))
    [ "$2" = "$3" ] || fail "$1: got '$3', want '$2'"
}

# exits NAME CODE PATTERN CMD...: CMD exits CODE and its stderr matches PATTERN
exits() {
    name=$1 code=$2 pat=$3
    shift 3
    cases=$((cases + 1))
    "$@" >"$T/o" 2>"$T/e"
    rc=$?
    [ $rc -eq "$code" ] || { fail "$name: exit $rc, want $code ($(cat "$T/e"))"; return; }
    grep -q -- "$pat" "$T/e" || fail "$name: stderr '$(cat "$T/e")' lacks '$pat'"
}

printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nun\n##aff\n##able\ncafe\n' >"$T/vocab.txt"
V="$DMOVE tokenize --tokenizer $T/vocab.txt --lowercase"

same ids "2 5 7 6 8 3" "$(echo 'Hello, World!' | $V)"
same no-special "9 10 11" "$(echo 'unaffable' | $V --no-special)"
same tokens2 "[CLS] un ##aff ##able , cafe [SEP]" "$(echo 'unaffable, café' | $V --tokens)"
same empty-line "2 3" "$(printf '\n' | $V)"
same crlf "2 5 3|2 6 3" "$(printf 'hello\r\nworld' | $V | tr '\n' '|' | sed 's/|$//')"
# digest of [2 5 3]: FNV-1a 64 over 02000000 05000000 03000000
want=$(python3 -c 'import struct
h=0xcbf29ce484222325
for b in struct.pack("<3i",2,5,3): h=((h^b)*0x100000001b3)&0xffffffffffffffff
print("3 %016x" % h)' 2>/dev/null)
[ -n "$want" ] && same digest "$want" "$(echo hello | $V --digest)"
printf 'hello\nworld\n' >"$T/a.txt"
printf 'cafe\n' >"$T/b.txt"
same files "2 5 3|2 6 3|2 12 3|2 8 3" "$(echo '!' | $V "$T/a.txt" "$T/b.txt" - | tr '\n' '|' | sed 's/|$//')"
awk 'BEGIN { for (i = 0; i < 3000; i++) print "hello, world! unaffable cafe " i % 7 }' >"$T/many.txt"
one=$($V --threads 1 --digest "$T/many.txt" | cksum)
three=$($V --threads 3 --digest "$T/many.txt" | cksum)
same threads "$one" "$three"
same lines "3000" "$($V "$T/many.txt" | wc -l | tr -d ' ')"

printf 'hello\nwor\377ld\n' >"$T/bad.txt"
exits bad-utf8 1 "bad.txt: invalid UTF-8 at byte offset 9 (line 2)" $V "$T/bad.txt"
same bad-utf8-first-line "2 5 3" "$(cat "$T/o")"
printf '{"model":{"type":"BPE","vocab":{},"merges":[]}}' >"$T/bpe.json"
exits bpe 1 "only WordPiece (BERT)" "$DMOVE" tokenize --tokenizer "$T/bpe.json"
exits no-tokenizer 2 "--tokenizer FILE is required" "$DMOVE" tokenize
exits vocab-casing 2 "choose lowercase" "$DMOVE" tokenize --tokenizer "$T/vocab.txt"
exits both-casings 2 "exclude each other" $V --cased
exits missing-input 1 "nope.txt: cannot open" $V "$T/nope.txt"
exits directory 1 "is a directory" $V "$T"
exits unknown-option 2 "unknown option" $V --frobnicate
exits missing-tokenizer 1 "cannot open" "$DMOVE" tokenize --tokenizer "$T/none.json"
cases=$((cases + 1))
"$DMOVE" tokenize --help | grep -q 'examples:' || fail "--help has no examples"
cases=$((cases + 1))
$V --describe | grep -q 'WordPiece, 13 tokens, lowercase' || fail "--describe: $($V --describe)"
# a model's directory: its vocab.txt, cased as its tokenizer_config.json says
mkdir "$T/model" && cp "$T/vocab.txt" "$T/model/"
exits dir-casing 2 "choose lowercase" "$DMOVE" tokenize --tokenizer "$T/model" --describe
printf '{"do_lower_case": false}\n' >"$T/model/tokenizer_config.json"
cases=$((cases + 1))
"$DMOVE" tokenize --tokenizer "$T/model" --describe | grep -q 'WordPiece, 13 tokens, cased' ||
    fail "a model directory with do_lower_case false: $("$DMOVE" tokenize --tokenizer "$T/model" --describe 2>&1)"

echo "test_tokenize_cli.sh: $cases cases, $fails failed"
[ $fails -eq 0 ]
