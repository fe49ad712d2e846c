#!/bin/sh
# test_prepare_cli.sh: `dmove prepare` and `dmove batches` end to end on a tiny corpus and a
# small vocab.txt written here. Good runs (shards, manifest, summary, valid split, a file a
# document, several shards, --force, decoded batches, determinism and resume by --start,
# pairs with NSP, --bench), then bad input: each case exits 1 (bad input) or 2 (usage)
# with a message naming the problem, and leaves nothing behind (no dataset, no temporary
# directory); then shards truncated, edited, or read with another vocabulary are refused.
# Usage: DMOVE=build/dmove sh tests/test_prepare_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_prepare_cli.sh dmove_prepare
cd "$T" || exit 1

# bad NAME CODE PATTERN ARGS...: must exit CODE with PATTERN (grep -E) on stderr, and leave
# no directory out/ and no temporary directory.
bad() {
    expect "$@"
    if [ -e out ] || ls -d ./*.tmp-* >/dev/null 2>&1; then
        fail "$1: left output behind"
        rm -rf out ./*.tmp-*
    fi
}

{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in the a quick brown fox jumps over lazy dog cat sat on mat hello world and then \
             it was is in of to run ran home . , '!' '?' s '##s' '##ing' '##ed' play walk talk; do
        echo "$w"
    done
} >vocab.txt
grep -v '^\[MASK\]$' vocab.txt >nomask.txt
{ cat vocab.txt; echo extra; } >vocab2.txt

cat >a.txt <<'EOF'
The quick brown fox jumps over the lazy dog.
A cat sat on the mat, and then it ran home!

Hello world. It was playing in the walking dog's home.
The dog walked to the cat.
Zebras are unknown here.


The cat talks.
EOF
printf 'hello world\nthe brown cat jumps.\n\nA dog ran home?\n' >b.txt

# --- good runs ---
good "prepare" prepare --tokenizer vocab.txt --lowercase --out data a.txt b.txt
has "prepare summary" stdout 'train: 5 documents, 9 sentences, [0-9]+ tokens, [0-9]+ unknown'
has "prepare manifest" data/dataset.json '"format":[[:space:]]*"dmove-dataset"'
[ -f data/train-00000.shard ] || fail "prepare: no data/train-00000.shard"
[ -e data/valid.shard ] && fail "prepare: a valid shard without --valid-fraction"

good "doc per file" prepare --tokenizer vocab.txt --lowercase --out perfile --doc-per-file a.txt b.txt
has "doc per file" stdout 'train: 2 documents, 9 sentences'

good "valid split" prepare --tokenizer vocab.txt --lowercase --out split --valid-fraction 0.5 --seed 3 a.txt b.txt
has "valid split" stdout 'valid: [0-9]+ documents'
[ -f split/valid.shard ] || fail "valid split: no split/valid.shard"

mkfifo pipe
cat a.txt >pipe &
writer=$!
good "a pipe" prepare --tokenizer vocab.txt --lowercase --out piped pipe
kill "$writer" 2>/dev/null # still blocked in open() if dmove never read the pipe
wait "$writer" 2>/dev/null
has "a pipe" stdout 'train: 3 documents, 6 sentences'

# a line of Unicode whitespace alone (no-break spaces, U+3000, U+2028) ends a document, as
# Python's str.strip() makes it blank for BERT's create_pretraining_data
printf 'hello world\n\302\240 \343\200\200\n the cat.\n\342\200\250\n a dog.\n' >uniblank.txt
good "unicode blank" prepare --tokenizer vocab.txt --lowercase --out uniblank uniblank.txt
has "unicode blank" stdout 'train: 3 documents, 3 sentences'
printf 'hello world\n\342\200A\nthe cat.\n' >nearblank.txt # E2 80 41: no U+2000, invalid UTF-8
bad "invalid UTF-8 that looks blank" 1 "invalid UTF-8" prepare --tokenizer vocab.txt --lowercase --out nearblank \
    nearblank.txt

good "force" prepare --tokenizer vocab.txt --lowercase --out perfile --force a.txt
has "force" stdout 'train: 3 documents'

# several shards: about 3 MB of text, a shard a MiB
i=0
while [ $i -lt 4000 ]; do
    printf 'the quick brown fox jumps over the lazy dog and the cat sat on the mat.\n'
    printf 'hello world, it was the dog.\nthen the cat ran home!\n'
    [ $((i % 3)) -eq 0 ] && printf '\n'
    i=$((i + 1))
done >big1.txt
cat big1.txt big1.txt big1.txt big1.txt big1.txt big1.txt big1.txt big1.txt big1.txt big1.txt >big.txt
good "shards" prepare --tokenizer vocab.txt --lowercase --out many --shard-mb 1 --threads 2 big.txt
cp stdout many.txt
good "one thread" prepare --tokenizer vocab.txt --lowercase --out many1 --shard-mb 1 --threads 1 --quiet big.txt
for f in many/*.shard; do
    cmp -s "$f" "many1/${f#many/}" || fail "threads: $f differs between --threads 2 and 1"
done
cp many.txt stdout
[ -f many/train-00001.shard ] || fail "shards: no second shard with --shard-mb 1"
has "shards" stdout 'train: [0-9]+ documents, [0-9]+ sentences, [0-9]+ tokens, 0 unknown \(0.000%\), [2-9] shards'

good "show" batches --data data --tokenizer vocab.txt --lowercase --seq 16 --batch 2 --show 4 --mask-prob 0.3
has "show" stdout '^  \[CLS\] '
has "show" stdout '\[SEP\]'
has "show" stdout '\{'
has "show" stdout '\[PAD\]x[0-9]+'
cp stdout show1
good "show again" batches --data data --tokenizer vocab.txt --lowercase --seq 16 --batch 2 --show 4 --mask-prob 0.3
cmp -s stdout show1 || fail "determinism: the same options gave other batches"
good "other seed" batches --data data --tokenizer vocab.txt --lowercase --seq 16 --batch 2 --show 4 --mask-prob 0.3 --seed 9
cmp -s stdout show1 && fail "seed: another seed gave the same batches"
good "resume" batches --data data --tokenizer vocab.txt --lowercase --seq 16 --batch 2 --show 2 --mask-prob 0.3 --start 1
sed -n '/^batch 1,/,$p' show1 >want
sed -n '/^batch 1,/,$p' stdout >got
cases=$((cases + 1))
if [ ! -s want ] || ! cmp -s want got; then fail "resume: --start 1 differs from batch 1 of a run from 0"; fi

good "pairs" batches --data many --tokenizer vocab.txt --lowercase --seq 24 --pairs --nsp --show 6
has "pairs" stdout 'nsp [01] \(B (follows A|random)\)'
good "valid batches" batches --data split --split valid --tokenizer vocab.txt --lowercase --seq 16 --show 1
good "bench" batches --data many --tokenizer vocab.txt --lowercase --seq 64 --batch 8 --bench 20
has "bench" stdout 'batches/s'
has "bench" stdout 'next\(\) waited'

# --- bad input: exit 1 or 2, a message, nothing left ---
: >empty.txt
printf '\n   \n\t\n' >blank.txt
printf 'the cat\nthe \377dog\n' >badutf8.txt
mkdir -p adir
bad "empty corpus" 1 'no token' prepare --tokenizer vocab.txt --lowercase --out out empty.txt
bad "blank corpus" 1 'no token' prepare --tokenizer vocab.txt --lowercase --out out blank.txt empty.txt
bad "a directory" 1 'is a directory' prepare --tokenizer vocab.txt --lowercase --out out adir
bad "missing file" 1 "cannot read 'nofile.txt'" prepare --tokenizer vocab.txt --lowercase --out out a.txt nofile.txt
bad "invalid UTF-8" 1 "badutf8.txt.*byte offset 12" prepare --tokenizer vocab.txt --lowercase --out out a.txt badutf8.txt
cases=$((cases + 1))
if cat a.txt b.txt | "$DMOVE" prepare --tokenizer vocab.txt --lowercase --out fromstdin - >stdout 2>stderr &&
    [ -s fromstdin/dataset.json ]; then
    echo "ok   prepare - (standard input)"
else
    fail "prepare - (standard input): $(head -2 stderr)"
fi
printf 'hello world\nthe cat sat\n' | gzip -c >text.gz
bad "a gzip file" 1 "text.gz' is gzip-compressed, not text: decompress it first" prepare --tokenizer vocab.txt \
    --lowercase --out out text.gz
bad "no [MASK]" 1 'MASK' prepare --tokenizer nomask.txt --lowercase --out out a.txt
bad "no tokenizer" 2 'tokenizer' prepare --out out a.txt
bad "no files" 2 'no text file' prepare --tokenizer vocab.txt --lowercase --out out
bad "valid fraction" 2 'valid-fraction' prepare --tokenizer vocab.txt --lowercase --out out --valid-fraction 0.9 a.txt
bad "both cases" 2 'exclude' prepare --tokenizer vocab.txt --lowercase --cased --out out a.txt
bad "out is a file" 1 'not a directory' prepare --tokenizer vocab.txt --lowercase --out a.txt b.txt
bad "existing dataset" 1 'already holds a dataset.*--force' prepare --tokenizer vocab.txt --lowercase --out data a.txt
mkdir -p other && echo keep >other/keep.txt
bad "non-empty dir" 1 'not empty' prepare --tokenizer vocab.txt --lowercase --out other --force a.txt
[ -f other/keep.txt ] || fail "non-empty dir: its file was touched"
if [ "$(id -u)" -ne 0 ]; then
    printf 'the cat\n' >locked.txt && chmod 000 locked.txt
    bad "unreadable" 1 "cannot read 'locked.txt'" prepare --tokenizer vocab.txt --lowercase --out out locked.txt
fi

bad "seq too small" 2 'too small' batches --data data --tokenizer vocab.txt --lowercase --seq 2
bad "pairs seq too small" 2 'too small' batches --data data --tokenizer vocab.txt --lowercase --seq 4 --pairs
bad "nsp without pairs" 2 'needs --pairs' batches --data data --tokenizer vocab.txt --lowercase --nsp
good "one document" prepare --tokenizer vocab.txt --lowercase --out onedoc --doc-per-file a.txt
bad "nsp one document" 1 '2 documents' batches --data onedoc --tokenizer vocab.txt --lowercase --pairs --nsp
bad "other vocabulary" 1 'another tokenizer' batches --data data --tokenizer vocab2.txt --lowercase
bad "other casing" 1 'another tokenizer' batches --data data --tokenizer vocab.txt --cased
bad "no valid split" 1 'no valid split' batches --data data --split valid --tokenizer vocab.txt --lowercase
bad "not a dataset" 1 'dataset.json' batches --data adir --tokenizer vocab.txt --lowercase

cp -r data edited
size=$(wc -c <data/train-00000.shard)
printf 'X' | dd of=edited/train-00000.shard bs=1 seek=$((size - 20)) conv=notrunc 2>/dev/null
bad "edited shard" 1 'checksum' batches --data edited --tokenizer vocab.txt --lowercase
head -c $((size - 8)) data/train-00000.shard >edited/train-00000.shard
bad "truncated shard" 1 'truncated' batches --data edited --tokenizer vocab.txt --lowercase
cp perfile/train-00000.shard edited/train-00000.shard
bad "swapped shard" 1 'dataset.json says' batches --data edited --tokenizer vocab.txt --lowercase
rm edited/train-00000.shard
bad "missing shard" 1 'cannot open shard' batches --data edited --tokenizer vocab.txt --lowercase

echo "test_prepare_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
