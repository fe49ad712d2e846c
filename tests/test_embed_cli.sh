#!/bin/sh
# test_embed_cli.sh: `dmove embed` without network, on a tiny BERT that `dmove pretrain`
# makes here (a vocab.txt, one step, --export): one embedding per input line in input
# order whatever the lengths (lines sorted into buckets and back), the same numbers in every
# format, file or standard input, batch size and thread count (to rounding), [CLS] pooling,
# normalized rows of norm 1, empty input, and bad input exiting 1 or 2 naming the problem.
# (tests/test_embed_real.sh checks the numbers against transformers on real weights.)
# Usage: DMOVE=build/dmove sh tests/test_embed_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_embed_cli.sh dmove_embed_cli
cd "$T" || exit 1
bad() { # bad NAME CODE PATTERN ARGS...: expect, and say what it said
    expect "$@" && echo "ok   $1: $(head -1 stderr)"
}

{
    printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n'
    for w in the a quick brown fox jumps over lazy dog cat sat on mat hello world and . , '!'; do echo "$w"; done
} >vocab.txt
i=0
while [ $i -lt 40 ]; do
    printf 'the quick brown fox jumps over the lazy dog.\nthe cat sat on the mat.\nhello world!\n'
    i=$((i + 1))
done >corpus.txt
good "prepare" prepare --tokenizer vocab.txt --lowercase --out data corpus.txt
good "pretrain --export" pretrain --data data --tokenizer vocab.txt --lowercase --layers 2 --hidden 16 --heads 2 \
    --ffn 32 --seq 16 --batch 4 --positions 64 --steps 1 --threads 2 --export m
E="embed --model m --tokenizer vocab.txt --lowercase --quiet"

# lines of 2 to 64 tokens, out of length order: buckets 8, 16, 32, 64 (cut at 64)
long="the quick brown fox jumps over the lazy dog ."
{
    echo "hello world"
    echo "$long $long $long $long $long $long $long $long"
    echo ""
    echo "$long $long"
    echo "the cat"
    echo "$long $long $long"
    echo "the cat sat on the mat"
} >in.txt
# shellcheck disable=SC2086
good "embed" $E --format tsv in.txt
cp stdout all.tsv
cases=$((cases + 1))
[ "$(wc -l <all.tsv)" -eq 7 ] && awk -F'\t' 'NF != 16 { exit 1 }' all.tsv || fail "embed: not 7 lines of 16 numbers"
# each line alone (one bucket, batch 1) is the same line of the whole run (to rounding)
n=0
while IFS= read -r line; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    printf '%s\n' "$line" | "$DMOVE" $E --format tsv --batch 1 >one.tsv 2>stderr || fail "line $n alone: exit $?"
    sed -n "${n}p" all.tsv >want.tsv
    cases=$((cases + 1))
    paste want.tsv one.tsv | awk -F'\t' '{ for (i = 1; i <= 16; i++) { d = $i - $(i + 16); if (d < 0) d = -d; if (d > 1e-5) exit 1 } }' ||
        fail "line $n alone differs from its line in the whole run"
done <in.txt
echo "ok   embed: 7 lines in input order, each as it is alone"
# the GPU from the command: --device cuda (emulated on the host, where dmove is built with
# CUDA) gives the same embeddings to rounding, every bucket unpadded
close() { # 7 lines, each number within 1e-5 of the CPU's
    [ "$(wc -l <"$1")" -eq 7 ] && paste all.tsv "$1" |
        awk -F'\t' '{ for (i = 1; i <= 16; i++) { d = $i - $(i + 16); if (d < 0) d = -d; if (d > 1e-5) exit 1 } }'
}
# shellcheck disable=SC2086
same_on_cuda "embed --device cuda (emulated)" stdout close $E --format tsv in.txt
# text is tsv with spaces; standard input and 1 thread, batch 3: the same to rounding
# shellcheck disable=SC2086
good "embed text" $E --threads 1 --batch 3 <in.txt
cases=$((cases + 1))
tr ' ' '\t' <stdout | paste - all.tsv | awk -F'\t' '{ for (i = 1; i <= 16; i++) { d = $i - $(i + 16); if (d < 0) d = -d; if (d > 1e-5) exit 1 } }' ||
    fail "embed: standard input, text, 1 thread, batch 3 differs"
# normalized: every row of norm 1
# shellcheck disable=SC2086
good "embed --normalize" $E --normalize --pooling cls --format tsv in.txt
cases=$((cases + 1))
awk -F'\t' '{ s = 0; for (i = 1; i <= NF; i++) s += $i * $i; if (s < 0.9999 || s > 1.0001) exit 1 }' stdout ||
    fail "embed --normalize: a row's norm is not 1"
cmp -s stdout all.tsv && fail "embed --pooling cls gave the mean"
# npy and safetensors
# shellcheck disable=SC2086
good "embed npy" $E --format npy --out e.npy in.txt
has "npy shape" e.npy "'shape': \\(7, 16\\)"
# shellcheck disable=SC2086
good "embed safetensors" $E --format safetensors --out e.safetensors in.txt
has "safetensors tensor" e.safetensors '"embeddings":\{"dtype":"F32","shape":\[7,16\]'
# a sentence-transformers layout (modules.json; the encoder in 0_Transformer/ as older
# versions saved it): its pooling, Normalize and max_seq_length are the defaults
mkdir -p st/0_Transformer st/1_Pooling && cp m/model.safetensors m/config.json vocab.txt st/0_Transformer/
printf '{"do_lower_case": true}' >st/0_Transformer/tokenizer_config.json
printf '[{"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
 {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
 {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]\n' >st/modules.json
printf '{"word_embedding_dimension": 16, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}' \
    >st/1_Pooling/config.json
printf '{"max_seq_length": 12}' >st/0_Transformer/sentence_bert_config.json
good "embed a sentence-transformers model" embed --model st --format tsv in.txt
has "its settings said" stderr "a sentence-transformers model: pooling cls, normalized, max_seq_length 12"
cp stdout st.tsv
# shellcheck disable=SC2086
good "embed as its settings say" $E --pooling cls --normalize --max-length 12 --format tsv in.txt
cases=$((cases + 1))
cmp -s stdout st.tsv || fail "a sentence-transformers model's defaults differ from --pooling cls --normalize --max-length 12"
# a max_seq_length past the positions: cut at the positions, saying so; the weights named
# alone beside modules.json: the options' pooling, with a note that says so
printf '{"max_seq_length": 1000}' >st/0_Transformer/sentence_bert_config.json
good "embed a max_seq_length past the positions" embed --model st --format tsv in.txt
has "the cut said" stderr "max_seq_length 1000 is past the model's 64 positions: texts are cut at 64 tokens"
printf '{"max_seq_length": 12}' >st/0_Transformer/sentence_bert_config.json
mkdir -p st_root && cp st/modules.json st/0_Transformer/* st_root/
good "embed the weights of a sentence-transformers model" embed --model st_root/model.safetensors in.txt
has "the note on the weights alone" stderr "is a sentence-transformers model's .*apply with --model st_root"
bad "embed a config.json for the model" 1 "is a JSON file: give the model's directory" \
    embed --model st_root/config.json in.txt
# sentence-transformers 5's files: "pooling_mode" by name, the length as the tokenizer's
# model_max_length
printf '{"embedding_dimension": 16, "pooling_mode": "cls", "include_prompt": true}' >st/1_Pooling/config.json
printf '{}' >st/0_Transformer/sentence_bert_config.json
printf '{"do_lower_case": true, "model_max_length": 12}' >st/0_Transformer/tokenizer_config.json
good "embed a sentence-transformers 5 model" embed --model st --format tsv in.txt
cases=$((cases + 1))
cmp -s stdout st.tsv || fail "sentence-transformers 5's pooling_mode and model_max_length not taken"
printf '{"max_seq_length": 12}' >st/0_Transformer/sentence_bert_config.json
printf '{"do_lower_case": true}' >st/0_Transformer/tokenizer_config.json
printf '{"pooling_mode_cls_token": true}' >st/1_Pooling/config.json
bad "embed a model pooling cls and mean (mean's absent key)" 1 "pools by cls_token \+ mean_tokens" embed --model st in.txt
printf '{"max_seq_length": 12, "do_lower_case": true}' >st/0_Transformer/sentence_bert_config.json
printf '{"do_lower_case": false}' >st/0_Transformer/tokenizer_config.json
bad "embed do_lower_case over a cased tokenizer" 1 "do_lower_case true .* which dmove embed does not do" \
    embed --model st --pooling cls in.txt
printf '{"max_seq_length": 12}' >st/0_Transformer/sentence_bert_config.json
printf '{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false}' >st/1_Pooling/config.json
bad "embed a max-pooling model" 1 "the model pools by max_tokens; dmove embed pools by mean or cls" embed --model st in.txt
good "embed a max-pooling model with --pooling" embed --model st --pooling mean --quiet in.txt
printf '[{"path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
 {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
 {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]\n' >st/modules.json
bad "embed a model with a Dense module" 1 "sentence_transformers.models.Dense module, which dmove embed does not run" \
    embed --model st in.txt
# --out through a symbolic link writes its target (the link kept); a FIFO is written, not
# replaced
echo old >target && ln -s target link && mkfifo fifo
# shellcheck disable=SC2086
good "embed --out a link" $E --format npy --out link in.txt
cases=$((cases + 1))
{ [ -L link ] && cmp -s target e.npy; } || fail "embed --out link: the link replaced, or its target not written"
cat fifo >from_fifo &
# shellcheck disable=SC2086
good "embed --out a FIFO" $E --format npy --out fifo in.txt
wait
cases=$((cases + 1))
{ [ -p fifo ] && cmp -s from_fifo e.npy; } || fail "embed --out fifo: the FIFO replaced, or nothing read from it"
# empty input: no lines
# shellcheck disable=SC2086
good "embed empty" $E </dev/null
cases=$((cases + 1))
[ ! -s stdout ] || fail "embed of no lines printed something"
# --layers-from: the embeddings and the last layer
# shellcheck disable=SC2086
good "embed --layers-from 1" $E --layers-from 1 in.txt

# shellcheck disable=SC2086
bad "no --model" 2 "--model DIR is required" embed --tokenizer vocab.txt --lowercase in.txt
# shellcheck disable=SC2086
bad "safetensors to stdout" 2 "needs --out" $E --format safetensors in.txt
# shellcheck disable=SC2086
bad "--max-length past the positions" 2 "the model has 64 positions" $E --max-length 65 in.txt
# shellcheck disable=SC2086
bad "--layers-from past the layers" 2 "layers 0 to 1" $E --layers-from 2 in.txt
# shellcheck disable=SC2086
bad "unknown pooling" 2 "unknown pooling 'max'" $E --pooling max in.txt
# shellcheck disable=SC2086
bad "two input files" 2 "one input file at most" $E in.txt in.txt
bad "no model there" 1 "cannot open 'nothere'" embed --model nothere --tokenizer vocab.txt --lowercase in.txt
bad "no tokenizer.json" 1 "tokenizer.json" embed --model m in.txt
bad "vocab.txt without casing" 2 "choose lowercase .*give --lowercase or --cased" embed --model m --tokenizer vocab.txt in.txt
printf 'caf\303\251 \377\n' >badutf.txt
# shellcheck disable=SC2086
bad "invalid UTF-8" 1 "badutf.txt:1: invalid UTF-8 at byte" $E badutf.txt
{ cat vocab.txt; i=0; while [ $i -lt 30 ]; do echo "extra$i"; i=$((i + 1)); done; } >big.txt
bad "a tokenizer larger than the vocabulary" 1 "the model's vocabulary" embed --model m --tokenizer big.txt \
    --lowercase in.txt
mkdir m2 && cp m/model.safetensors m2/
bad "no config.json" 1 "no config.json" embed --model m2 --tokenizer vocab.txt --lowercase in.txt
# a model directory with a vocab.txt and no tokenizer.json: cased as its tokenizer_config.json says
# shellcheck disable=SC2086
good "embed, to compare" $E in.txt
mv stdout lower.txt
mkdir mv && cp m/model.safetensors m/config.json vocab.txt mv/
bad "a vocab.txt model without tokenizer_config.json" 2 "choose lowercase .*give --lowercase or --cased" embed --model mv in.txt
printf '{"do_lower_case": true, "tokenizer_class": "BertTokenizer"}\n' >mv/tokenizer_config.json
good "embed of a vocab.txt model" embed --model mv --quiet in.txt
cases=$((cases + 1))
if [ -s lower.txt ] && cmp -s stdout lower.txt; then
    echo "ok   embed of a vocab.txt model: --tokenizer vocab.txt --lowercase's embeddings"
else
    fail "embed of a vocab.txt model differs from --tokenizer vocab.txt --lowercase"
fi
mkdir shard && cp m/config.json shard/ && printf '{"weight_map": {}}\n' >shard/model.safetensors.index.json
bad "a sharded checkpoint" 1 "sharded checkpoint" embed --model shard --tokenizer vocab.txt --lowercase in.txt
mkdir -p sdir/model.safetensors && cp m/config.json sdir/
bad "model.safetensors a directory" 1 "is a directory" embed --model sdir --tokenizer vocab.txt --lowercase in.txt

echo "test_embed_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
