#!/bin/sh
# test_pretrain_cli.sh: `dmove pretrain` end to end: a small vocab.txt and a corpus written
# here, `dmove prepare` with a held-out split, then a tiny BERT pretrained on it: the loss
# falls, the held-out loss and accuracy are reported, the summary says how long the step
# waited for data, the chart and --json are written; then bad input exits 1 or 2 naming
# the problem (no data, a config of another vocabulary, a sequence longer than the
# positions, shards of another tokenizer, a sequence too short for the special tokens).
# Usage: DMOVE=build/dmove sh tests/test_pretrain_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_pretrain_cli.sh dmove_pretrain
cd "$T" || exit 1
bad() { # bad NAME CODE PATTERN ARGS...: expect, and say what it said
    expect "$@" && echo "ok   $1: $(head -1 stderr)"
}

{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in the a quick brown fox jumps over lazy dog cat sat on mat hello world and then \
             it was is in of to run ran home . , '!' s '##s' play walk; do
        echo "$w"
    done
} >vocab.txt
{ cat vocab.txt; echo extra; } >vocab2.txt
i=0
while [ $i -lt 300 ]; do
    printf 'the quick brown fox jumps over the lazy dog.\nthe cat sat on the mat.\n'
    printf 'hello world, the dog ran home!\n\n'
    i=$((i + 1))
done >corpus.txt

good "prepare" prepare --tokenizer vocab.txt --lowercase --out data --valid-fraction 0.1 corpus.txt
P="pretrain --data data --tokenizer vocab.txt --lowercase --layers 2 --hidden 32 --heads 2 --ffn 64 --seq 32 \
--batch 8 --lr 3e-3 --warmup 5 --lr-schedule linear --threads 2"
# shellcheck disable=SC2086 # P is words
good "pretrain" $P --steps 60 --eval-every 20 --svg loss.svg --export trained
has "pretrain header" stdout '^dmove pretrain: BERT of 2 layers \(i=32 h=2 u=64'
has "pretrain progress" stdout '^step 60/60  loss [0-9.]+  acc [0-9.]+'
has "pretrain held-out" stdout '^  held-out at step 60: loss [0-9.]+, masked-token accuracy'
has "pretrain waited for data" stdout 'waiting for data [0-9.]+'
has "pretrain chart" loss.svg "<polyline"
has "pretrain chart: held-out points" loss.svg "step 40: held-out loss [0-9.]+"
has "pretrain chart: accuracy panel" loss.svg "masked-token accuracy"
first=$(sed -n 's/^loss \([0-9.]*\) (step 1) -> \([0-9.]*\) .*/\1/p' stdout)
last=$(sed -n 's/^loss \([0-9.]*\) (step 1) -> \([0-9.]*\) .*/\2/p' stdout)
cases=$((cases + 1))
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b < 0.5 * a) }' || fail "the loss did not halve: $first -> $last"
echo "ok   pretrain: loss $first -> $last"
# --eval-every 0: at the end alone (it once meant the default, about 10 times)
# shellcheck disable=SC2086 # P is words
good "pretrain --eval-every 0" $P --steps 20 --eval-every 0
cases=$((cases + 1))
[ "$(grep -c '^  held-out at step' stdout)" = 1 ] && grep -q '^  held-out at step 20:' stdout ||
    fail "pretrain --eval-every 0: $(grep -c '^  held-out at step' stdout) evaluations, not 1 at the end"
# shellcheck disable=SC2086
good "pretrain --export" $P --steps 6 --export exported --save six.ckpt
has "pretrain --export: the config" exported/config.json '"architectures": \["BertForMaskedLM"\]'
has "pretrain --export: the sizes" exported/config.json '"hidden_size": 32,'
[ -s exported/model.safetensors ] || fail "pretrain --export: no model.safetensors"
# dmove export: the checkpoint's model, the same files as --export of the run
good "export" export --checkpoint six.ckpt --out from-ckpt
for f in model.safetensors config.json; do
    cases=$((cases + 1))
    cmp -s exported/$f from-ckpt/$f || fail "dmove export: $f differs from pretrain --export's"
done
echo "ok   export: model.safetensors and config.json byte-identical to pretrain --export's"
bad "export of a non-checkpoint" 1 "not a dmove checkpoint" export --checkpoint exported/model.safetensors --out x
bad "export without --out" 2 "are required" export --checkpoint six.ckpt
good "a stack's checkpoint" train --layers 1 --hidden 32 --heads 2 --ffn 64 --seq 8 --batch 2 --steps 1 --save stack.ckpt
bad "export of a stack's checkpoint" 1 "a checkpoint of a stack of layers" export --checkpoint stack.ckpt --out x
cp six.ckpt edited.ckpt
printf 'X' | dd of=edited.ckpt bs=1 seek=$(($(wc -c <six.ckpt) - 100)) conv=notrunc 2>/dev/null
bad "export of an edited checkpoint" 1 "checksum mismatch" export --checkpoint edited.ckpt --out x
cases=$((cases + 1))
[ ! -e x ] || fail "a refused export left x behind"
# --init: the whole BertForMaskedLM trained above goes on from where it was (its first
# loss far below a new model's), its sizes from its config.json
good "pretrain --init" pretrain --data data --tokenizer vocab.txt --lowercase --init trained --seq 32 --batch 8 \
    --lr 3e-3 --steps 2 --threads 2
has "pretrain --init said so" stdout '^  parameters from trained$'
has "pretrain --init: the config's sizes" stdout '^dmove pretrain: BERT of 2 layers \(i=32 h=2 u=64'
init_first=$(sed -n 's/^loss \([0-9.]*\) (step 1) -> .*/\1/p' stdout)
cases=$((cases + 1))
awk -v a="$first" -v b="$init_first" 'BEGIN { exit !(b > 0 && b < 0.7 * a) }' ||
    fail "pretrain --init trained: first loss $init_first, not below a new model's $first"
echo "ok   pretrain --init: first loss $init_first (a new model's: $first)"
good "pretrain --init --layers-from" pretrain --data data --tokenizer vocab.txt --lowercase --init trained/model.safetensors \
    --layers-from 1 --seq 32 --batch 8 --steps 1 --threads 2
has "pretrain --layers-from said so" stdout '^  parameters from trained/model.safetensors \(layers 1 to 1\)$'
bad "--init with --config" 2 "--init with --config" pretrain --data data --tokenizer vocab.txt --lowercase \
    --init trained --config trained/config.json
bad "--layers-from without --init" 2 "needs --init" $P --steps 1 --layers-from 1
# shellcheck disable=SC2086
bad "--pairs with one token type" 2 "type_vocab_size 1" $P --steps 1 --pairs --types 1
has "--export: the decoder tied" trained/config.json '"tie_word_embeddings": true,'
bad "--layers-from past the model" 2 "the model has layers 0 to 1" pretrain --data data --tokenizer vocab.txt \
    --lowercase --init trained --layers-from 2
bad "--init --heads contradicting" 2 "--heads 4 contradicts" pretrain --data data --tokenizer vocab.txt \
    --lowercase --init trained --heads 4
# shellcheck disable=SC2086
good "pretrain --json" $P --steps 8 --json --optimizer lamb --accumulate 2
has "pretrain --json" stdout '"eval_loss":[0-9.]+,"eval_accuracy":[0-9.]+'

# --accumulate 2 of b=4 takes the update of one b=8 batch: the loss is the mean over every
# scored position of the two micro-batches (their counts differ), not the mean of their means
A="pretrain --data data --tokenizer vocab.txt --lowercase --layers 2 --hidden 32 --heads 2 --ffn 64 --seq 32 \
--lr 3e-3 --warmup 2 --lr-schedule linear --threads 2 --dropout 0 --steps 6 --eval-every 100 --json"
jn() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }
# shellcheck disable=SC2086
good "pretrain b=8" $A --batch 8
cp stdout big.json
# shellcheck disable=SC2086
good "pretrain b=4, --accumulate 2" $A --batch 4 --accumulate 2
cp stdout acc.json
for k in loss_first loss_last masked_scored; do
    cases=$((cases + 1))
    awk -v a="$(jn acc.json $k)" -v b="$(jn big.json $k)" 'BEGIN { d = a - b; if (d < 0) d = -d;
        exit !(a != "" && d <= 1e-5 * (b < 0 ? -b : b)) }' ||
        fail "--accumulate 2 x b=4 against b=8: $k $(jn acc.json $k) vs $(jn big.json $k)"
done

# the MLM head's decoder and cross-entropy fused (one operator, no logits in memory)
# shellcheck disable=SC2086
good "pretrain --fused-xent on" $P --steps 6 --fused-xent on
has "pretrain --fused-xent on: the held-out accuracy" stdout '^  held-out at step 6: loss [0-9.]+, masked-token accuracy'
# shellcheck disable=SC2086
bad "--fused-xent of no mode" 2 "is not auto, on or off" $P --steps 6 --fused-xent maybe

# checkpoints: a run in two parts (--until, --resume) equals the whole run, byte for byte
# shellcheck disable=SC2086
good "pretrain --save" $P --steps 12 --dropout 0.1 --accumulate 2 --save full.ckpt
has "pretrain --save said where" stdout '^checkpoint: full.ckpt \(step 12\)'
# shellcheck disable=SC2086
good "pretrain --until 5" $P --steps 12 --dropout 0.1 --accumulate 2 --save part.ckpt --until 5
# shellcheck disable=SC2086
good "pretrain --resume" $P --steps 12 --dropout 0.1 --accumulate 2 --save part.ckpt --resume part.ckpt
has "pretrain --resume went on" stdout '^loss [0-9.]+ \(step 6\) -> [0-9.]+ \(step 12\)'
cases=$((cases + 1))
cmp -s full.ckpt part.ckpt || fail "a pretraining run in two parts differs from the whole run"
echo "ok   pretrain: the run in two parts equals the whole run, byte for byte"
# a checkpoint as an older dmove wrote it (version 1: its checksum, its run tag; the test
# hook DMOVE_TEST_CHECKPOINT_V1) resumes, and the run ends as the whole run, byte for byte
# shellcheck disable=SC2086
DMOVE_TEST_CHECKPOINT_V1=1 "$DMOVE" $P --steps 12 --dropout 0.1 --accumulate 2 --save v1.ckpt --until 5 \
    >stdout 2>stderr || fail "a version-1 checkpoint: exit $?"
has "a version-1 checkpoint written" v1.ckpt '"version":"1"'
# shellcheck disable=SC2086
good "--resume a version-1 checkpoint" $P --steps 12 --dropout 0.1 --accumulate 2 --save v1.ckpt --resume v1.ckpt
cases=$((cases + 1))
cmp -s full.ckpt v1.ckpt || fail "a run resumed from a version-1 checkpoint differs from the whole run"
# shellcheck disable=SC2086
bad "--resume with another --mask-prob" 1 "run is pretrain" $P --steps 12 --dropout 0.1 --accumulate 2 \
    --mask-prob 0.2 --resume part.ckpt --steps 14
# shellcheck disable=SC2086
bad "--resume with another --predictions" 1 "run is pretrain .*predictions default" $P --steps 12 --dropout 0.1 \
    --accumulate 2 --predictions 8 --resume part.ckpt --steps 14
# the run is the data's, wherever it lies: the dataset moved resumes, another one of the
# same name (made of other text) is refused
mv data data_moved
# shellcheck disable=SC2086
good "--resume from the dataset moved" $P --steps 14 --dropout 0.1 --accumulate 2 --data data_moved --resume part.ckpt
awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : ""); print "" }' corpus.txt >reversed.txt
good "prepare other text" prepare --tokenizer vocab.txt --lowercase --out data --valid-fraction 0.1 reversed.txt
# shellcheck disable=SC2086
bad "--resume on other data of the same name" 1 "run is pretrain data [0-9a-f]+ " $P --steps 14 --dropout 0.1 \
    --accumulate 2 --resume part.ckpt
rm -rf data && mv data_moved data
# a checkpoint over a file the run reads inside --data, or over what --export writes
# shellcheck disable=SC2086
bad "--save over a shard" 2 "--save data/train-00000.shard is inside --data data: the run reads the files there" \
    $P --steps 2 --save data/train-00000.shard
# shellcheck disable=SC2086
bad "--save over the export" 2 "--save ex/model.safetensors is inside --export ex: the run writes that name" \
    $P --steps 2 --save ex/model.safetensors --export ex
# shellcheck disable=SC2086
good "--save a new file inside --data" $P --steps 6 --save data/new.ckpt
# shellcheck disable=SC2086
good "--save over a file of its own inside --data" $P --steps 6 --save data/new.ckpt
rm -f data/new.ckpt
bad "--until without --save" 2 "need --save" $P --steps 12 --until 3
# the kind of schedule is the run's: a constant rate after a decay is refused
# shellcheck disable=SC2086
bad "--resume with a constant schedule" 1 "this run's is constant" $P --dropout 0.1 --accumulate 2 --steps 12 \
    --lr-schedule constant --resume part.ckpt

# the GPU from the command: --device cuda (emulated on the host, where dmove is built with
# CUDA) trains sentence pairs (unpadded) to the CPU's losses and held-out numbers, dropout on
# shellcheck disable=SC2086
good "pretrain --pairs on the CPU, to compare" $P --steps 6 --dropout 0.1 --eval-every 3 --pairs
results() { grep -E '^(loss |  held-out)' "$1"; }
results stdout >cpu.txt
same() { [ -s cpu.txt ] && results "$1" | cmp -s - cpu.txt; }
# shellcheck disable=SC2086
if same_on_cuda "pretrain --device cuda (emulated)" stdout same $P --steps 6 --dropout 0.1 --eval-every 3 --pairs; then
    has "pretrain --device cuda says where" stdout '^  on the GPU \(fp32 storage, emulated'
    # the generated row kernels, which evaluation leaves for the interpreter, and the second stream
    # shellcheck disable=SC2086
    same_on_cuda "pretrain --device cuda --rows gen --streams 2 (emulated)" stdout same $P --steps 6 --dropout 0.1 \
        --eval-every 3 --pairs --rows gen --streams 2
    # the MLM head's decoder and cross-entropy fused (xent.cu): the unfused CPU run's numbers
    # shellcheck disable=SC2086
    same_on_cuda "pretrain --device cuda --fused-xent on (emulated)" stdout same $P --steps 6 --dropout 0.1 \
        --eval-every 3 --pairs --fused-xent on
    # one rank on the data-parallel path (the gradients' reduction; NCCL's on a GPU)
    export DMOVE_DIST_REDUCE_ALONE=1
    # shellcheck disable=SC2086
    same_on_cuda "pretrain --device cuda, one rank reducing (emulated)" stdout same $P --steps 6 --dropout 0.1 \
        --eval-every 3 --pairs
    unset DMOVE_DIST_REDUCE_ALONE
fi

printf '{"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "num_hidden_layers": 2}' >config.json
bad "no --data" 2 "--data DIR and --tokenizer FILE are required \\(or --init DIR" pretrain --tokenizer vocab.txt --lowercase
bad "a config of another vocabulary" 1 "vocab_size 99, but the tokenizer has" pretrain --data data \
    --tokenizer vocab.txt --lowercase --config config.json
bad "--seq past --positions" 1 "max_position_embeddings" pretrain --data data --tokenizer vocab.txt --lowercase \
    --hidden 32 --heads 2 --ffn 64 --seq 64 --positions 32 --batch 2 --steps 1
bad "shards of another tokenizer" 1 "vocabulary|hash|tokenizer" pretrain --data data --tokenizer vocab2.txt \
    --lowercase --hidden 32 --heads 2 --ffn 64 --seq 32 --batch 2 --steps 1
bad "--seq too short" 1 "special tokens|too small|at least" pretrain --data data --tokenizer vocab.txt --lowercase \
    --hidden 32 --heads 2 --ffn 64 --seq 2 --batch 2 --steps 1
bad "a data directory that is not one" 1 "not a directory" pretrain --data vocab.txt --tokenizer vocab.txt --lowercase \
    --hidden 32 --heads 2 --ffn 64 --seq 32 --batch 2 --steps 1

echo "test_pretrain_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
