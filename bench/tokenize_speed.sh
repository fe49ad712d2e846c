#!/bin/sh
# tokenize_speed.sh: MB/s of `dmove tokenize` (1 thread and all threads) against Hugging Face
# `tokenizers` in batch mode (RAYON_NUM_THREADS=1 and all threads), on the same text in one
# run, medians of a few repetitions. The work is done by bench/tokenize_speed.py (it needs
# python3 with `tokenizers`); --help prints what it measures and its options.
#   bench/tokenize_speed.sh                      # the agreement corpus, bert-base-uncased
#   bench/tokenize_speed.sh --dmove build-cpu/dmove --reps 5 --tokenizer tests/text/tok/wp-cased.json
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null 2>&1 || { echo "tokenize_speed.sh: needs python3 (with tokenizers)" >&2; exit 1; }
python3 -c 'import tokenizers' 2>/dev/null || { echo "tokenize_speed.sh: needs the Python package tokenizers (pip install tokenizers)" >&2; exit 1; }
exec python3 "$here/tokenize_speed.py" "$@"
