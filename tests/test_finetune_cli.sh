#!/bin/sh
# test_finetune_cli.sh: `dmove finetune` end to end: a small vocab.txt and a synthetic
# three-class task written here (a sentence holds words of praise, of blame, or neither,
# among filler words; a TSV to train on with a header, a JSONL held-out file), a tiny BERT
# fine-tuned on it from scratch: held-out accuracy well above chance (1/3), the chart, --json,
# pairs of texts, --export's config with the class names, --init from that export; a run in two parts (--until,
# --resume) equals the whole run byte for byte; then bad input exits 1 or 2 naming the file
# and line (a label outside --labels, a line without a label, invalid UTF-8, a label only
# the held-out file has, one class).
# Usage: DMOVE=build/dmove sh tests/test_finetune_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_finetune_cli.sh dmove_finetune
cd "$T" || exit 1
bad() { # bad NAME CODE PATTERN ARGS...: expect, and say what it said
    expect "$@" && echo "ok   $1: $(head -1 stderr)"
}

{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in good great fine happy bad awful sad poor the a cat dog sat ran on in mat home park day it was \
             and then . ,; do
        echo "$w"
    done
} >vocab.txt
# examples N SEED FORMAT: N sentences of 3 to 7 words, every second one a class word (or none)
examples() {
    awk -v n="$1" -v seed="$2" -v fmt="$3" 'BEGIN {
        srand(seed)
        split("the a cat dog sat ran on in mat home park day it was and then", fill, " ")
        split("good great fine happy", pos, " "); split("bad awful sad poor", neg, " ")
        if (fmt == "tsv") print "sentence\tlabel"
        for (k = 0; k < n; k++) {
            c = int(rand() * 3); len = 3 + int(rand() * 5); s = ""
            for (i = 0; i < len; i++) {
                w = fill[1 + int(rand() * 16)]
                if (i % 2 == 0 && c == 0) w = pos[1 + int(rand() * 4)]
                if (i % 2 == 0 && c == 1) w = neg[1 + int(rand() * 4)]
                s = s (i ? " " : "") w
            }
            lab = c == 0 ? "positive" : c == 1 ? "negative" : "neutral"
            if (fmt == "tsv") print s "\t" lab
            else printf "{\"text\": \"%s.\", \"label\": \"%s\"}\n", s, lab
        }
    }'
}
examples 480 1 tsv >train.tsv
examples 150 2 jsonl >eval.jsonl

F="finetune --tokenizer vocab.txt --lowercase --layers 2 --hidden 32 --heads 2 --ffn 64 --seq 16 --batch 16 \
--lr 2e-3 --warmup 4 --lr-schedule linear --threads 2 --seed 3"
# the learning run: i=64 and 4 heads learn the task from every seed tried (1, 3, 5, 9: held-out
# accuracy 1.0 after 4 epochs); i=32 and 2 heads, as transformers' own BertForSequenceClassification
# of that size, often stall at 2/3 (two classes told apart, the third merged with one)
# shellcheck disable=SC2086 # F is words
good "finetune" $F --hidden 64 --heads 4 --ffn 128 --lr 1e-3 --warmup 10 --train train.tsv --eval eval.jsonl \
    --epochs 4 --eval-every 40 --svg ft.svg --export model
has "finetune header" stderr '^dmove finetune: BertForSequenceClassification, 3 classes \(negative, neutral, \.\.\.\)'
has "finetune progress" stderr '^step 120/120  loss [0-9.]+  acc [0-9.]+  lr'
has "finetune held-out" stderr '^  held-out at step 40: accuracy [0-9.]+, loss [0-9.]+'
has "finetune chart" ft.svg '<polyline'
has "finetune --export: the class" model/config.json '"architectures": \["BertForSequenceClassification"\]'
has "finetune --export: the names" model/config.json '"2": "positive"'
has "finetune --export: label2id" model/config.json '"neutral": 1'
[ -s model/model.safetensors ] || fail "finetune --export: no model.safetensors"
acc=$(sed -n 's/.*held-out accuracy \([0-9.]*\) (150 examples).*/\1/p' stdout)
cases=$((cases + 1))
if awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }'; then
    echo "ok   finetune: held-out accuracy $acc on 3 classes (chance 0.33)"
else
    fail "held-out accuracy '$acc': not well above chance (1/3)"
fi
# the GPU from the command: --device cuda (emulated on the host, where dmove is built with
# CUDA) gives the CPU's losses and held-out accuracy (short lines: unpadded), dropout on
# shellcheck disable=SC2086
good "finetune on the CPU, to compare" $F --train train.tsv --eval eval.jsonl --epochs 1 --eval-every 15 --dropout 0.1
results() { grep -E '^(step |  held-out)' "$1" | sed 's/  [0-9.]* s\/step.*//'; } # the times aside
results stderr >cpu.txt
same() { [ -s cpu.txt ] && results "$1" | cmp -s - cpu.txt; }
# shellcheck disable=SC2086
if same_on_cuda "finetune --device cuda (emulated)" stderr same $F --train train.tsv --eval eval.jsonl --epochs 1 \
    --eval-every 15 --dropout 0.1; then
    has "finetune --device cuda says where" stderr '^  on the GPU \(fp32 storage, emulated'
fi
# 3000 classes of long names: config.json's id2label and label2id past 1 MB, exported whole
# (the weights and the config, the config made first) and read back by --init
long=$(printf 'x%.0s' $(seq 1 180))
awk -v l="$long" 'BEGIN { for (k = 0; k < 3000; k++) printf "a good day\t%s%04d\n", l, k }' >many.tsv
# shellcheck disable=SC2086
good "finetune, 3000 classes" $F --batch 64 --train many.tsv --epochs 1 --export many
[ "$(wc -c <many/config.json)" -gt 1048576 ] || fail "3000 classes: config.json is not past 1 MB"
has "3000 classes: the last name" many/config.json "\"2999\": \"${long}2999\""
ls -a many | grep -q dmove-export && fail "3000 classes: the temporary config was left in many/"
good "finetune --init from 3000 classes" finetune --tokenizer vocab.txt --lowercase --seq 16 --batch 16 --threads 2 \
    --train train.tsv --epochs 1 --init many

# --init: the exported model's embeddings, encoder and pooler (a new classifier): one epoch
# from them is enough
good "finetune --init" finetune --tokenizer vocab.txt --lowercase --seq 16 --batch 16 --lr 1e-3 --threads 2 \
    --train train.tsv --eval eval.jsonl --epochs 1 --init model
has "finetune --init: the parameters" stderr '^  --init: parameters from model/model.safetensors; the classifier starts new$'
has "finetune --init: the sizes" stderr '2 layers \(i=64 h=4 u=128;.*from --init'
acc=$(sed -n 's/.*held-out accuracy \([0-9.]*\) (150 examples).*/\1/p' stdout)
cases=$((cases + 1))
awk -v a="$acc" 'BEGIN { exit !(a >= 0.8) }' || fail "held-out accuracy '$acc' after one epoch from --init"
bad "--init with a contradicting --hidden" 2 "--hidden 32 contradicts" finetune --tokenizer vocab.txt --lowercase \
    --train train.tsv --init model --hidden 32
bad "--init and --config" 2 "exclude each other" finetune --tokenizer vocab.txt --lowercase --train train.tsv \
    --init model --config model/config.json
# transformers' classifier_dropout, where it differs from the layers' dropout: refused (dmove
# has one), unless --dropout gives one
mkdir -p cdrop && cp model/model.safetensors cdrop/ && sed 's/^{/{"classifier_dropout": 0.5,/' model/config.json >cdrop/config.json
bad "classifier_dropout" 1 "--init: classifier_dropout 0.5 differs from hidden_dropout_prob 0.1: .*give --dropout P" \
    finetune --tokenizer vocab.txt --lowercase --train train.tsv --init cdrop --epochs 1
# --layers-from: the model's second layer alone (--layers defaults to the rest)
good "finetune --init --layers-from" finetune --tokenizer vocab.txt --lowercase --seq 16 --batch 16 --threads 2 \
    --train train.tsv --epochs 1 --init model --layers-from 1 --export from1
has "finetune --layers-from: the layers" stderr 'parameters from model/model.safetensors \(layers 1 to 1\)'
has "finetune --layers-from: one layer" stderr '1 layers \(i=64 h=4 u=128;.*from --init'
has "finetune --layers-from: its export" from1/config.json '"num_hidden_layers": 1'
bad "--layers-from past the layers" 2 "--layers-from 2: the model has layers 0 to 1" finetune --tokenizer vocab.txt \
    --lowercase --train train.tsv --init model --layers-from 2
bad "--layers-from without --init" 2 "it needs --init" finetune --tokenizer vocab.txt --lowercase \
    --train train.tsv --layers-from 1
# shellcheck disable=SC2086
good "finetune --json" $F --train train.tsv --eval eval.jsonl --epochs 1 --json --labels neutral,positive,negative
has "finetune --json" stdout '"classes":3,.*"eval_accuracy":[0-9.]+,"eval_loss":[0-9.]+'

# pairs: text TAB text_b TAB label, and JSONL's text_pair; the label is which text holds the class word
awk -F '\t' 'NR > 1 { print $1 "\tthe cat sat\t" $2 }' train.tsv | head -64 >pairs.tsv
printf '{"text": "the dog", "text_pair": "a good day", "label": 2}\n{"text": "a bad day", "text_b": "it was", "label": 1}\n' >pairs.jsonl
# shellcheck disable=SC2086
good "finetune pairs" $F --train pairs.tsv --eval pairs.jsonl --labels negative,neutral,positive,1,2 --epochs 2

# checkpoints: a run in two parts (--until, --resume) equals the whole run, byte for byte
# shellcheck disable=SC2086
good "finetune --save" $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 --save full.ckpt
# shellcheck disable=SC2086
good "finetune --until 6" $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 --save part.ckpt --until 6
# shellcheck disable=SC2086
good "finetune --resume" $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 --save part.ckpt --resume part.ckpt
has "finetune --resume went on" stdout '^loss [0-9.]+ \(step 7\) -> [0-9.]+ \(step 15\)'
cases=$((cases + 1))
cmp -s full.ckpt part.ckpt || fail "a fine-tuning run in two parts differs from the whole run"
echo "ok   finetune: the run in two parts equals the whole run, byte for byte"
# the checkpoint exported: the files finetune --export writes at its step, the class names in them
# shellcheck disable=SC2086
good "finetune --export, the whole run again" $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 \
    --export ftexp
good "export of a finetune checkpoint" export --checkpoint full.ckpt --out ckexp
cases=$((cases + 1))
if cmp -s ckexp/model.safetensors ftexp/model.safetensors && cmp -s ckexp/config.json ftexp/config.json; then
    echo "ok   export of a finetune checkpoint: finetune --export's files, byte for byte"
else
    fail "export of a finetune checkpoint differs from finetune --export's files"
fi
has "export of a finetune checkpoint: the class names" ckexp/config.json '"1": "neutral"'
# with --tokenizer: vocab.txt and tokenizer_config.json beside; again without: a note that the
# tokenizer there is from before; a tokenizer.json there: refused before anything is written
good "export --tokenizer" export --checkpoint full.ckpt --out ckexp --tokenizer vocab.txt --lowercase
has "export --tokenizer: BertTokenizer" ckexp/tokenizer_config.json '"tokenizer_class":[[:space:]]*"BertTokenizer"'
cmp -s ckexp/vocab.txt vocab.txt || fail "export --tokenizer: vocab.txt differs from the run's"
expect "export again, no --tokenizer" 0 "holds a tokenizer from before \(vocab.txt\)" \
    export --checkpoint full.ckpt --out ckexp
echo '{}' >ckexp/tokenizer.json
rm ckexp/model.safetensors
expect "export --tokenizer, a tokenizer.json there" 1 "holds tokenizer.json.*instead of.*nothing written" \
    export --checkpoint full.ckpt --out ckexp --tokenizer vocab.txt --lowercase
[ -e ckexp/model.safetensors ] && fail "export --tokenizer refused: the model was written"
# a tokenizer larger than the model's vocabulary: refused, nothing written
{ printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'; seq 1 5000 | sed 's/^/w/'; } >big-vocab.txt
expect "export --tokenizer larger than the vocabulary" 1 "has 5005 tokens and the model's vocabulary [0-9]+.*nothing written" \
    export --checkpoint full.ckpt --out bigexp --tokenizer big-vocab.txt --lowercase
[ -e bigexp/model.safetensors ] && fail "export --tokenizer larger than the vocabulary: the model was written"
# --init: a config whose two dropouts differ takes --dropout, and says so without it
sed 's/"attention_probs_dropout_prob": [0-9.e-]*/"attention_probs_dropout_prob": 0/' model/config.json >cfg.tmp
mkdir -p dropdiff && cp model/model.safetensors dropdiff/ && mv cfg.tmp dropdiff/config.json
good "finetune --init with two dropouts and --dropout" finetune --tokenizer vocab.txt --lowercase --seq 16 \
    --batch 16 --threads 2 --train train.tsv --epochs 1 --init dropdiff --dropout 0.1
mkdir -p onetype && cp model/model.safetensors onetype/ &&
    sed 's/"type_vocab_size": [0-9]*/"type_vocab_size": 1/' model/config.json >onetype/config.json
bad "pairs for a model of one token type" 1 "type_vocab_size 1" finetune --tokenizer vocab.txt --lowercase --seq 16 \
    --batch 16 --threads 2 --train pairs.tsv --epochs 1 --config onetype/config.json
# the same config over weights of two token types: named before a model is made
bad "a config that contradicts its weights" 1 "token_type_embeddings.weight is .2, 64., but the config.s type_vocab_size" \
    finetune --tokenizer vocab.txt --lowercase --seq 16 --batch 16 --threads 2 --train train.tsv --epochs 1 --init onetype
printf '{"text": "a good day", "label": 1e400}\n' >inf.jsonl
# shellcheck disable=SC2086
bad "a label of an infinite number" 1 "inf.jsonl:1: \"label\" is a number out of range" $F --train inf.jsonl
bad "finetune --init with two dropouts" 1 "give --dropout P to train with one" finetune --tokenizer vocab.txt \
    --lowercase --seq 16 --batch 16 --threads 2 --train train.tsv --epochs 1 --init dropdiff
# an older dmove's (version 1) checkpoint of this run: its batches ran across epochs, so it
# is refused, saying why
# shellcheck disable=SC2086
DMOVE_TEST_CHECKPOINT_V1=1 "$DMOVE" $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 --save v1.ckpt \
    --until 6 >stdout 2>stderr || fail "a version-1 checkpoint: exit $?"
# shellcheck disable=SC2086
bad "--resume a version-1 finetune checkpoint" 1 "version 1, from an older dmove.*batches ran on across epochs" \
    $F --train train.tsv --epochs 1 --dropout 0.1 --accumulate 2 --save v1.ckpt --resume v1.ckpt
head -400 train.tsv >fewer.tsv
# shellcheck disable=SC2086
bad "--resume on other examples" 1 "run is finetune data [0-9a-f]+ " $F --train fewer.tsv --epochs 1 --dropout 0.1 \
    --accumulate 2 --resume part.ckpt
# shellcheck disable=SC2086
bad "--resume with other classes" 1 "run is finetune|num_labels" $F --train train.tsv --epochs 1 --dropout 0.1 \
    --accumulate 2 --labels negative,neutral,positive,other --resume part.ckpt

# bad input: the file and the line
printf 'a good day\tpositive\nthe cat\tnegative\nit was\tmaybe\n' >other.tsv
# shellcheck disable=SC2086
bad "a label outside --labels" 1 "other.tsv:3: label 'maybe' is not one of the 3 classes" $F --train other.tsv \
    --labels negative,neutral,positive
printf 'a good day\tpositive\nthe cat sat\n' >nolabel.tsv
# shellcheck disable=SC2086
bad "a line without a label" 1 "nolabel.tsv:2: no label" $F --train nolabel.tsv
printf '{"text": "a good day", "label": "positive"}\n{"text": "the cat"}\n' >nolabel.jsonl
# shellcheck disable=SC2086
bad "a JSONL line without a label" 1 "nolabel.jsonl:2: no label" $F --train train.tsv --eval nolabel.jsonl
printf 'a good day\tpositive\nthe \377cat\tnegative\n' >badutf.tsv
# shellcheck disable=SC2086
bad "invalid UTF-8" 1 "badutf.tsv:2: invalid UTF-8 at byte 5" $F --train badutf.tsv
printf '{"text": "a good day", "label": "great"}\n' >evalonly.jsonl
# shellcheck disable=SC2086
bad "a label only the held-out file has" 1 "evalonly.jsonl:1: label 'great' is not one of the 3 classes" $F \
    --train train.tsv --eval evalonly.jsonl
printf 'a good day\tpositive\nthe cat\tpositive\n' >oneclass.tsv
# shellcheck disable=SC2086
bad "one class" 1 "1 class \(positive\): a classifier needs 2 or more" $F --train oneclass.tsv
printf '{"text": "a good day", "label": "positive"\n' >broken.jsonl
# shellcheck disable=SC2086
bad "not JSON" 1 "broken.jsonl:1: not valid JSON at byte 43 of the line: a .,. or .}. missing" $F --train broken.jsonl
bad "no --train" 2 "--train FILE and --tokenizer FILE are required \\(or --init DIR" finetune --tokenizer vocab.txt --lowercase
bad "--init missing, no --tokenizer" 1 "--init nope: No such file" finetune --train train.tsv --init nope
bad "--init without a tokenizer" 1 "'model' is a directory with no tokenizer.json or vocab.txt" finetune --train train.tsv --init model
# shellcheck disable=SC2086
bad "--until without --save" 2 "need --save" $F --train train.tsv --until 3
# shellcheck disable=SC2086
bad "--labels twice" 2 "'neutral' twice" $F --train train.tsv --labels neutral,positive,neutral

# JSONL read as JSON is (Python's json): what cJSON alone would take is refused, naming
# the line; number labels named as Python names them
G="finetune --tokenizer vocab.txt --lowercase --layers 1 --hidden 16 --heads 2 --ffn 32 --seq 8 --batch 2 --epochs 1"
jl() { printf '%s\n' "$@" >j.jsonl; }
jl '{"text": "a good day\u0000 and more", "label": "x"}' '{"text": "b", "label": "y"}'
# shellcheck disable=SC2086
bad "JSONL \\u0000" 1 "j.jsonl:1: not valid JSON at byte 21 of the line: .u0000, a NUL" $G --train j.jsonl
jl '{"text": "a\uZZZZ", "label": "x"}'
# shellcheck disable=SC2086
bad "JSONL bad escape" 1 "j.jsonl:1: not valid JSON .*an invalid escape" $G --train j.jsonl
jl '{"text": "a \ud83d b", "label": "x"}'
# shellcheck disable=SC2086
bad "JSONL lone surrogate" 1 "j.jsonl:1: .*high surrogate .* without its low half" $G --train j.jsonl
jl '{"text": "a", "label": "x"}' '{"text": "a", "label": "x", "label": "y"}'
# shellcheck disable=SC2086
bad "JSONL key twice" 1 "j.jsonl:2: the key \"label\" twice" $G --train j.jsonl
jl '{"text": "a", "label": "x"} {"text": "b", "label": "y"}'
# shellcheck disable=SC2086
bad "JSONL two objects" 1 "j.jsonl:1: .*text after the JSON object" $G --train j.jsonl
jl '{"text": "a", "label": 01}'
# shellcheck disable=SC2086
bad "JSONL 01" 1 "j.jsonl:1: .*an invalid number" $G --train j.jsonl
jl '{"text": "a", "label": "x", "score": NaN, "range": [-Infinity, Infinity]}' '{"text": "b", "label": "y"}'
# shellcheck disable=SC2086
good "JSONL NaN and Infinity in other keys (Python writes them)" $G --train j.jsonl
jl '{"text": "a", "label": NaN}'
# shellcheck disable=SC2086
bad "JSONL a NaN label" 1 "j.jsonl:1: \"label\" is NaN" $G --train j.jsonl
jl '{"text": "a", "text_b": "b", "text_pair": "c", "label": "x"}'
# shellcheck disable=SC2086
bad "JSONL text_b and text_pair" 1 "both \"text_b\" and \"text_pair\"" $G --train j.jsonl
printf '\357\273\277{"text": "a good day", "label": 0.1}\n{"text": "a bad day", "label": 1e-7}\n{"text": "b", "label": 2.50}\n' >j.jsonl
# shellcheck disable=SC2086
good "JSONL number labels" $G --train j.jsonl --labels 1e-07,0.1,2.5
has "number labels as Python names them" stderr "3 classes \(1e-07, 0.1, \.\.\.\)"
# shellcheck disable=SC2086
good "short last batch" $G --train j.jsonl --labels 1e-07,0.1,2.5 --epochs 3
has "each epoch its own batches: 3 x 2" stderr "3 epochs, 6 steps"
printf 'a good day\tpositive\rb bad day\tnegative\r' >cr.tsv
# shellcheck disable=SC2086
bad "TSV with CR line ends" 1 "cr.tsv:1: a carriage return at byte 20" $G --train cr.tsv
printf 'a good\000day\tpositive\nbad\tnegative\n' >nul.tsv
# shellcheck disable=SC2086
bad "TSV with a NUL" 1 "nul.tsv:1: a NUL byte at byte 7" $G --train nul.tsv
printf 'sentence\tgold_label\na good day\tpositive\nbad\tnegative\n' >gold.tsv
# shellcheck disable=SC2086
good "header gold_label" $G --train gold.tsv
has "header gold_label: 2 classes" stderr "2 classes \(negative, positive\)"
# shellcheck disable=SC2086
bad "--labels of one class" 2 "--labels: 1 class \(positive\)" $G --train gold.tsv --labels positive

echo "test_finetune_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
