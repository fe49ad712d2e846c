#!/bin/sh
# test_cli_errors.sh: the dmove command on bad input: each case must exit 1 (bad input)
# or 2 (usage), print a message on stderr, never crash (no signal, no sanitizer report),
# and leave no output file behind. A few good runs first show the tool works at all.
# Input files are crafted here with printf/head/tr/dd (a tiny safetensors writer in sh)
# and with `dmove example`. Usage: DMOVE=build/dmove sh tests/test_cli_errors.sh
set -u

DMOVE=${DMOVE:?set DMOVE to the dmove binary, e.g. DMOVE=build/dmove}
case $DMOVE in /*) ;; *) DMOVE=$(pwd)/$DMOVE ;; esac
[ -x "$DMOVE" ] || { echo "test_cli_errors.sh: $DMOVE is not an executable" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/dmove_cli.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM
OUT=$T/out.safetensors
cases=0
fails=0

# --- a tiny safetensors writer ---------------------------------------------------------
# le64 N: N as 8 little-endian bytes.
le64() {
    n=$1 k=0 fmt=''
    while [ $k -lt 8 ]; do
        fmt="$fmt\\$(printf %03o $((n % 256)))"
        n=$((n / 256)) k=$((k + 1))
    done
    # shellcheck disable=SC2059 # the format is the point: it holds the octal escapes
    printf "$fmt"
}

# st_nbytes DTYPE SHAPE: bytes of a tensor (SHAPE: comma-separated, empty for a scalar).
st_nbytes() {
    case $1 in F64 | I64) nb=8 ;; F32 | I32) nb=4 ;; F16 | BF16 | I16) nb=2 ;; *) nb=1 ;; esac
    old_ifs=$IFS IFS=,
    for d in $2; do nb=$((nb * d)); done
    IFS=$old_ifs
    echo $nb
}

# st_write FILE NAME:DTYPE:SHAPE[:FILL]...: a valid safetensors file; every data byte is
# FILL (three octal digits, default 000). Tensors are laid out in the order given.
st_write() {
    f=$1
    shift
    hdr='{' off=0 sep=''
    for s in "$@"; do
        name=${s%%:*} rest=${s#*:}
        dt=${rest%%:*} rest=${rest#*:}
        shape=${rest%%:*}
        nb=$(st_nbytes "$dt" "$shape")
        hdr="$hdr$sep\"$name\":{\"dtype\":\"$dt\",\"shape\":[$shape],"
        hdr="$hdr\"data_offsets\":[$off,$((off + nb))]}"
        off=$((off + nb)) sep=','
    done
    hdr="$hdr}"
    while [ $((${#hdr} % 8)) -ne 0 ]; do hdr="$hdr "; done
    {
        le64 ${#hdr}
        printf '%s' "$hdr"
        for s in "$@"; do
            rest=${s#*:}
            dt=${rest%%:*} rest=${rest#*:}
            shape=${rest%%:*} fill=000
            case $rest in *:*) fill=${rest#*:} ;; esac
            head -c "$(st_nbytes "$dt" "$shape")" /dev/zero | tr '\000' "\\$fill"
        done
    } >"$f"
}

# The 16 BertLayer parameters for sizes I and U (dtype DT), one spec per line.
params() {
    i=$1 u=$2 dt=${3:-F32}
    for p in attention.self.query attention.self.key attention.self.value attention.output.dense; do
        echo "$p.weight:$dt:$i,$i"
        echo "$p.bias:$dt:$i"
    done
    echo "attention.output.LayerNorm.weight:$dt:$i"
    echo "attention.output.LayerNorm.bias:$dt:$i"
    echo "intermediate.dense.weight:$dt:$u,$i"
    echo "intermediate.dense.bias:$dt:$u"
    echo "output.dense.weight:$dt:$i,$u"
    echo "output.dense.bias:$dt:$i"
    echo "output.LayerNorm.weight:$dt:$i"
    echo "output.LayerNorm.bias:$dt:$i"
}

# craft FILE SED_EXPR EXTRA_SPEC...: the b=1 j=2 i=4 u=8 parameter set edited by SED_EXPR
# (e.g. replace or delete a line), plus the extra tensors given.
craft() {
    f=$1 expr=$2
    shift 2
    # word splitting on newlines only: specs have no spaces
    old_ifs=$IFS IFS='
'
    # shellcheck disable=SC2046
    set -- "$@" $(params 4 8 | sed -e "$expr")
    IFS=$old_ifs
    st_write "$f" "$@"
}

# --- checks ------------------------------------------------------------------------------
no_output() {
    for o in "$OUT" "$OUT".tmp.*; do
        [ -e "$o" ] && return 1
    done
    return 0
}

# expect_fail NAME CODE PATTERN CMD...: CMD must exit CODE (1 or 2), say something on
# stderr matching PATTERN (grep -i; empty: anything), not crash, and write no OUT.
expect_fail() {
    name=$1 code=$2 pat=$3
    shift 3
    cases=$((cases + 1))
    rm -f "$OUT"
    "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    problem=''
    if [ $rc -eq 0 ]; then
        problem="exit 0"
    elif [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
        problem="exit $rc (a crash?)"
    elif [ $rc -ne "$code" ]; then
        problem="exit $rc, expected $code"
    fi
    [ -s "$T/stderr" ] || problem="$problem; no message on stderr"
    if grep -q -e 'Sanitizer' -e 'runtime error:' "$T/stderr"; then
        problem="$problem; sanitizer report"
    fi
    if [ -n "$pat" ] && ! grep -q -i -e "$pat" "$T/stderr"; then
        problem="$problem; stderr does not mention '$pat'"
    fi
    no_output || problem="$problem; an output file was left behind"
    if [ -n "$problem" ]; then
        fails=$((fails + 1))
        echo "FAIL $name: $problem"
        sed 's/^/    /' "$T/stderr"
    else
        echo "ok   $name: $(head -n 1 "$T/stderr")"
    fi
}

# expect_ok NAME CMD...: exit 0, no sanitizer report.
expect_ok() {
    name=$1
    shift
    cases=$((cases + 1))
    "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    if [ $rc -ne 0 ] || grep -q -e 'Sanitizer' -e 'runtime error:' "$T/stderr"; then
        fails=$((fails + 1))
        echo "FAIL $name: exit $rc"
        sed 's/^/    /' "$T/stderr"
        return 1
    fi
    echo "ok   $name"
    return 0
}

check() { # NAME CONDITION-COMMAND...
    name=$1
    shift
    cases=$((cases + 1))
    if "$@"; then
        echo "ok   $name"
    else
        fails=$((fails + 1))
        echo "FAIL $name"
    fi
}

D=$DMOVE
V=$T/valid.safetensors
# dmove layer writing to $OUT, and on the tiny valid file with 2 heads
lay() { "$D" layer --out "$OUT" "$@"; }
layv() { "$D" layer --in "$V" --out "$OUT" --heads 2 "$@"; }
# dmove layer --heads 2 on a crafted file
layf() { "$D" layer --in "$T/$1" --out "$OUT" --heads 2; }

# --- good runs: the baseline the failures are measured against ----------------------------
expect_ok "dmove --version" "$D" --version
expect_ok "dmove help" "$D" help
for c in layer bench example; do
    expect_ok "dmove $c --help" "$D" $c --help
    check "dmove $c --help has an example" grep -q 'example' "$T/stdout"
done
expect_ok "dmove example (tiny)" "$D" example --out "$V" --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16
expect_ok "dmove layer on it" layv
check "layer wrote its output" test -s "$OUT"
# the gradients in Hugging Face's shapes (i=8, u=16): weights (out, in), biases vectors
hf_shapes() {
    for w in attention.self.query attention.self.key attention.self.value attention.output.dense; do
        grep -a -q "\"$w.weight.grad\":{\"dtype\":\"F32\",\"shape\":\[8,8\]" "$1" || return 1
        grep -a -q "\"$w.bias.grad\":{\"dtype\":\"F32\",\"shape\":\[8\]" "$1" || return 1
    done
    grep -a -q '"intermediate.dense.weight.grad":{"dtype":"F32","shape":\[16,8\]' "$1" &&
        grep -a -q '"intermediate.dense.bias.grad":{"dtype":"F32","shape":\[16\]' "$1" &&
        grep -a -q '"output.dense.weight.grad":{"dtype":"F32","shape":\[8,16\]' "$1"
}
check "layer's gradients have Hugging Face's shapes" hf_shapes "$OUT"
expect_ok "dmove layer --schedule unfused --dropout 0" layv --schedule unfused --dropout 0
expect_ok "dmove layer --forward-only" layv --forward-only --act relu
# the options `dmove example` records become layer's defaults: --heads may be left out, and
# a file made with --dropout 0 --act relu runs with them (the same output as giving them)
M=$T/meta.safetensors
expect_ok "dmove example --dropout 0 --act relu" "$D" example --out "$M" --batch 2 --seq 4 --hidden 8 \
    --heads 2 --ffn 16 --dropout 0 --act relu
expect_ok "layer takes --heads, --dropout, --act from the metadata" "$D" layer --in "$M" --out "$T/m1.st"
check "layer says which options came from the metadata" grep -q "from the metadata.*--heads 2 --dropout 0 .*--act relu" "$T/stderr"
expect_ok "layer with the same options given" "$D" layer --in "$M" --out "$T/m2.st" --heads 2 --dropout 0 --act relu
check "metadata defaults give the same output as the options" cmp -s "$T/m1.st" "$T/m2.st"
expect_ok "layer with --act gelu over the metadata's relu" "$D" layer --in "$M" --out "$T/m3.st" --act gelu
check "an option given wins over the metadata" sh -c "! cmp -s '$T/m1.st' '$T/m3.st'"
# the layer variant travels the same way
expect_ok "dmove example --norm pre --causal" "$D" example --out "$M" --batch 2 --seq 4 --hidden 8 --heads 2 \
    --ffn 16 --norm pre --causal
expect_ok "layer takes --norm and --causal from the metadata" "$D" layer --in "$M" --out "$T/m4.st"
check "layer says so" grep -q "from the metadata.*--norm pre --causal" "$T/stderr"
expect_ok "layer with --norm pre --causal given" "$D" layer --in "$M" --out "$T/m5.st" --norm pre --causal
check "the same output either way" cmp -s "$T/m4.st" "$T/m5.st"
expect_ok "layer with --norm post over the metadata's pre" "$D" layer --in "$M" --out "$T/m6.st" --norm post
check "another layer, another output" sh -c "! cmp -s '$T/m4.st' '$T/m6.st'"
expect_ok "layer with --causal=0 over the metadata's causal" "$D" layer --in "$M" --out "$T/m7.st" --causal=0
expect_ok "layer with --norm pre given, not causal" "$D" layer --in "$M" --out "$T/m8.st" --norm pre --causal=0
check "--causal=0 wins over the metadata" sh -c "! cmp -s '$T/m4.st' '$T/m7.st' && cmp -s '$T/m7.st' '$T/m8.st'"
Z=$T/zeros.safetensors
craft "$Z" 's/:F32:/:F64:/' hidden_states:BF16:1,2,4 attention_mask:BOOL:1,2:001 grad_output:F16:1,2,4
expect_ok "dmove layer on F64/BF16/F16/BOOL inputs (shell-written)" lay --in "$Z" --heads 2
# every byte 0xff: hidden_states all NaN; layer runs, and says so
craft "$T/nanin" '' hidden_states:F32:1,2,4:377
expect_ok "dmove layer on NaN inputs" lay --in "$T/nanin" --heads 2
check "layer notes the NaN inputs" grep -q "hidden_states' has 8 NaN or infinite values" "$T/stderr"
rm -f "$OUT"

# --- usage errors (exit 2) ----------------------------------------------------------------
expect_fail "no command" 2 "usage" "$D"
expect_fail "unknown command" 2 "unknown command" "$D" frobnicate
expect_fail "help for an unknown command" 2 "unknown command" "$D" help frobnicate
expect_fail "layer: no --in" 2 "--in" "$D" layer --out "$OUT" --heads 2
expect_fail "layer: no --out" 2 "--out" "$D" layer --in "$V" --heads 2
# a file with no "heads" in its metadata needs --heads (the shell-written $Z has none)
expect_fail "layer: no --heads" 2 "--heads H is required" "$D" layer --in "$Z" --out "$OUT"
expect_fail "layer: --out is --in" 2 "is the --in file" "$D" layer --in "$V" --out "$V" --heads 2
check "layer: --out is --in left the input alone" "$D" layer --in "$V" --out "$OUT" --heads 2
expect_fail "layer: --out a directory" 2 "is a directory" "$D" layer --in "$V" --out "$T" --heads 2
expect_fail "layer: --out followed by an option" 2 "next argument is the option '--forward-only'" \
    "$D" layer --in "$V" --out --forward-only --heads 2
check "nothing named --forward-only was written" test ! -e ./--forward-only
expect_fail "tune: --out a directory, before measuring" 2 "is a directory" timeout 20 "$D" tune --out "$T" --no-cache
expect_fail "example: --out a directory" 2 "is a directory" "$D" example --out "$T"
expect_fail "layer: --in without a value" 2 "needs a value" "$D" layer --out "$OUT" --heads 2 --in
expect_fail "layer: unknown option" 2 "unknown option" layv --bogus
expect_fail "layer: stray argument" 2 "unexpected argument" "$D" layer "$V" --out "$OUT" --heads 2
expect_fail "layer: --batch (sizes come from the file)" 2 "from the tensors" layv --batch 4
expect_fail "layer: unknown --act" 2 "unknown activation" layv --act swish
expect_fail "layer: unknown --schedule" 2 "unknown schedule" layv --schedule both
expect_fail "layer: --forward-only=1" 2 "takes no value" layv --forward-only=1
for p in -0.1 1 1.5 nan inf abc "" 0.5x; do
    expect_fail "layer: --dropout '$p'" 2 "--dropout" layv --dropout "$p"
done
expect_fail "layer: --eps 0" 2 "--eps" layv --eps 0
expect_fail "layer: --eps -1e-5" 2 "--eps" layv --eps -1e-5
expect_fail "layer: --heads 0" 2 "--heads" "$D" layer --in "$V" --out "$OUT" --heads 0
expect_fail "layer: --heads abc" 2 "--heads" "$D" layer --in "$V" --out "$OUT" --heads abc
expect_fail "layer: --heads 2x" 2 "--heads" lay --in "$V" --heads 2x
expect_fail "layer: --heads ' 2'" 2 "--heads" "$D" layer --in "$V" --out "$OUT" --heads " 2"
expect_fail "layer: --seed -1" 2 "--seed" layv --seed -1
expect_fail "layer: --seed 1.5" 2 "--seed" layv --seed 1.5
expect_fail "layer: --seed 2^64" 2 "--seed" layv --seed 18446744073709551616
expect_fail "layer: --threads -1" 2 "--threads" layv --threads -1
expect_fail "bench: unknown option" 2 "unknown option" "$D" bench --bogus
expect_fail "bench: unknown --act" 2 "unknown activation" "$D" bench --act swish
expect_fail "bench: unknown --norm" 2 "unknown LayerNorm placement" "$D" bench --norm sideways
expect_fail "layer: --causal=yes" 2 "takes no value, or 0 or 1" layv --causal=yes
expect_fail "layer: --recompute with --schedule unfused" 2 "fused schedule" layv --recompute --schedule unfused
expect_ok "layer --recompute" "$D" layer --in "$V" --out "$T/rc.st" --heads 2 --recompute
expect_ok "layer without it" "$D" layer --in "$V" --out "$T/norc.st" --heads 2
check "--recompute: the same numbers, byte for byte" cmp -s "$T/rc.st" "$T/norc.st"
expect_fail "bench: unknown --preset" 2 "unknown preset" "$D" bench --preset bert-huge
expect_fail "bench: unknown --schedule" 2 "unknown schedule" "$D" bench --schedule sideways
expect_fail "bench: unknown --dtype" 2 "unknown storage type" "$D" bench --dtype fp8
expect_fail "bench: unknown --device" 2 "unknown device" "$D" bench --device tpu
expect_fail "bench: bf16 on the CPU" 2 "needs the CUDA device" "$D" bench --dtype bf16 --reps 1
expect_fail "layer: fp16 on the CPU" 2 "needs the CUDA device" "$D" layer --in "$V" --out "$OUT" --heads 2 --dtype fp16
# the model commands say so before they read any data (the files named need not exist)
expect_fail "pretrain: bf16 on the CPU" 2 "needs the CUDA device" "$D" pretrain --data "$T" --tokenizer "$V" \
    --dtype bf16
expect_fail "finetune: bf16 on the CPU" 2 "needs the CUDA device" "$D" finetune --train "$V" --tokenizer "$V" \
    --dtype bf16
expect_fail "embed: fp16 on the CPU" 2 "needs the CUDA device" "$D" embed --model "$T" --dtype fp16
expect_fail "bench: unknown --rows" 2 "unknown row kernels 'fast'" "$D" bench --rows fast
expect_fail "bench: --rows gen on the CPU" 2 "needs --device cuda" "$D" bench --rows gen --reps 1
expect_fail "layer: --rows interp on the CPU" 2 "needs --device cuda" "$D" layer --in "$V" --out "$OUT" --heads 2 --rows interp
expect_fail "layer: --rows without a value" 2 "rows" "$D" layer --in "$V" --out "$OUT" --heads 2 --rows
expect_fail "bench: --streams 3" 2 "'3' is not 1 or 2" "$D" bench --streams 3
expect_fail "bench: --streams 2 on the CPU" 2 "needs --device cuda" "$D" bench --streams 2 --reps 1
expect_fail "layer: --streams 2 on the CPU" 2 "needs --device cuda" "$D" layer --in "$V" --out "$OUT" --heads 2 --streams 2
for p in -0.1 1 1.5 nan; do
    expect_fail "bench: --dropout '$p'" 2 "--dropout" "$D" bench --dropout "$p"
done
expect_fail "bench: --reps 0" 2 "--reps" "$D" bench --reps 0
expect_fail "bench: --warmup -1" 2 "--warmup" "$D" bench --warmup -1
expect_fail "bench: --json=yes" 2 "takes no value" "$D" bench --json=yes
expect_fail "bench: zero --batch" 2 "--batch" "$D" bench --batch 0
expect_fail "bench: zero --ffn" 2 "--ffn" "$D" bench --ffn 0
expect_fail "bench: negative --seq" 2 "--seq" "$D" bench --seq -5
expect_fail "bench: i not divisible by h" 2 "divisible" "$D" bench --hidden 100 --heads 12
expect_fail "bench: --batch 99999999999 (absurd)" 2 "batch" "$D" bench --batch 99999999999
expect_fail "bench: --batch beyond int64" 2 "too large" "$D" bench --batch 99999999999999999999
expect_fail "bench: attention scores overflow" 2 "" "$D" bench --batch 1000000 --seq 1000000
expect_fail "example: no --out" 2 "--out" "$D" example --batch 1
expect_fail "example: zero --hidden" 2 "--hidden" "$D" example --out "$OUT" --hidden 0
expect_fail "example: absurd sizes" 2 "" "$D" example --out "$OUT" --batch 1000000 --seq 1000000
expect_fail "example: too large to write" 2 "GiB" \
    "$D" example --out "$OUT" --batch 2048 --seq 256 --hidden 4096 --heads 16 --ffn 4096

# --- bad input files (exit 1) ---------------------------------------------------------------
expect_fail "missing input file" 1 "cannot open" lay --in "$T/nope.safetensors" --heads 2
expect_fail "input is a directory" 1 "directory" lay --in "$T" --heads 2
: >"$T/empty"
expect_fail "empty input file" 1 "empty" layf empty
printf 'abc' >"$T/short"
expect_fail "3-byte input file" 1 "8-byte" layf short
printf 'this is a text file, not safetensors\n' >"$T/text"
expect_fail "a text file" 1 "header" layf text
{ le64 1000; printf '{}'; } >"$T/hlen"
expect_fail "header length beyond the file" 1 "truncated" layf hlen
size=$(wc -c <"$V")
head -c $((size - 10)) "$V" >"$T/trunc"
expect_fail "truncated data section" 1 "truncated" layf trunc
head -c 100 "$V" >"$T/trunc2"
expect_fail "truncated inside the header" 1 "truncated" layf trunc2
cp "$V" "$T/corrupt1"
printf 'X' | dd of="$T/corrupt1" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_fail "corrupted header (first byte)" 1 "JSON" layf corrupt1
cp "$V" "$T/corrupt2"
printf '#}{"' | dd of="$T/corrupt2" bs=1 seek=40 conv=notrunc 2>/dev/null
expect_fail "corrupted header (middle)" 1 "" layf corrupt2
cp "$V" "$T/corrupt3"
printf '\377\377\377\377' | dd of="$T/corrupt3" bs=1 seek=4 conv=notrunc 2>/dev/null
expect_fail "corrupted header length" 1 "header length" layf corrupt3
{ le64 17; printf '{"a":{"dtype":1}}'; } >"$T/nonobj"
expect_fail "malformed entry" 1 "dtype" layf nonobj
st_write "$T/unk" "x:F32:2"
sed 's/"F32"/"F99"/' "$T/unk" >"$T/unkdt"
expect_fail "unknown dtype in the file" 1 "F99" layf unkdt

craft "$T/i64" '' hidden_states:I64:1,2,4
expect_fail "hidden_states as I64" 1 "hidden_states.*dtype I64" layf i64
craft "$T/pi32" 's/^output.dense.weight:F32/output.dense.weight:I32/' hidden_states:F32:1,2,4
expect_fail "a parameter as I32" 1 "output.dense.weight.*dtype I32" layf pi32
craft "$T/shape" 's/^attention.self.key.weight:F32:4,4/attention.self.key.weight:F32:4,3/' hidden_states:F32:1,2,4
expect_fail "wrong shape of a parameter" 1 "attention.self.key.weight.*\[4, 3\].*expected \[4, 4\]" layf shape
craft "$T/shape2" 's/^output.dense.weight:F32:4,8/output.dense.weight:F32:8,4/' hidden_states:F32:1,2,4
expect_fail "transposed FFN weight" 1 "output.dense.weight.*expected \[4, 8\]" layf shape2
craft "$T/miss" '/^output.LayerNorm.bias/d' hidden_states:F32:1,2,4
expect_fail "missing parameter" 1 "output.LayerNorm.bias.*missing" layf miss
craft "$T/misshs" ''
expect_fail "missing hidden_states" 1 "hidden_states.*missing" layf misshs
craft "$T/prefix" 's/^/bert.encoder.layer.0./' hidden_states:F32:1,2,4
expect_fail "parameters with a model prefix" 1 "prefix" layf prefix
craft "$T/hs2d" '' hidden_states:F32:2,4
expect_fail "hidden_states with 2 dims" 1 "3 dimensions" layf hs2d
craft "$T/zero" '' hidden_states:F32:0,2,4
expect_fail "zero batch in hidden_states" 1 "at least 1" layf zero
craft "$T/zerou" 's/:8,4$/:0,4/; s/:4,8$/:4,0/; s/^\(intermediate.dense.bias:F32:\)8$/\10/' \
    hidden_states:F32:1,2,4
expect_fail "zero FFN width" 1 "intermediate.dense.weight" layf zerou
craft "$T/ok" '' hidden_states:F32:1,2,4
expect_fail "i not divisible by heads" 1 "divisible" lay --in "$T/ok" --heads 3
expect_fail "more heads than i" 1 "" lay --in "$T/ok" --heads 8
craft "$T/mask2" '' hidden_states:F32:1,2,4 attention_mask:U8:1,2:002
expect_fail "attention_mask value 2" 1 "attention_mask.*0 for padding" layf mask2
craft "$T/maskshape" '' hidden_states:F32:1,2,4 attention_mask:F32:2,1
expect_fail "attention_mask of the wrong shape" 1 "attention_mask.*expected \[1, 2\]" layf maskshape
craft "$T/gshape" '' hidden_states:F32:1,2,4 grad_output:F32:1,2,5
expect_fail "grad_output of the wrong shape" 1 "grad_output.*expected \[1, 2, 4\]" layf gshape
craft "$T/gdt" '' hidden_states:F32:1,2,4 grad_output:I8:1,2,4
expect_fail "grad_output as I8" 1 "grad_output.*dtype I8" layf gdt
expect_fail "output into a missing directory" 1 "cannot create.*does not exist" \
    "$D" layer --in "$T/ok" --out "$T/no/dir/out.safetensors" --heads 2
check "nothing created for the missing directory" test ! -e "$T/no"

# tune and plan files
expect_fail "tune: --reps 0" 2 "--reps" "$D" tune --reps 0
expect_fail "tune: --cache with --no-cache" 2 "contradict" "$D" tune --cache "$T/c.tsv" --no-cache
expect_fail "tune: stray argument" 2 "unexpected argument 'plan.json'" "$D" tune plan.json
expect_fail "train: stray argument" 2 "unexpected argument" "$D" train data.safetensors
expect_fail "tune: unknown --schedule" 2 "unknown schedule" "$D" tune --schedule sideways
expect_fail "tune: i not divisible by h" 2 "divisible" "$D" tune --hidden 10 --heads 3
expect_fail "bench: --plan missing file" 1 "cannot open plan" "$D" bench --plan "$T/none.json" --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8
printf '{"format": "dmove-plan", "version": 1' >"$T/trunc.json"
expect_fail "bench: --plan truncated" 1 "not valid JSON" "$D" bench --plan "$T/trunc.json" --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8
printf '{"format": "dmove-plan", "version": 1}' >"$T/older.json"
expect_fail "bench: --plan of format 1 (before lone GEMMs defaulted to the direct kernel)" 1 "older dmove: run .dmove tune. again" \
    "$D" bench --plan "$T/older.json" --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8
printf '{"format": "dmove-plan", "version": 99}' >"$T/newer.json"
expect_fail "layer: --plan newer version" 1 "newer dmove" lay --in "$T/ok" --heads 2 --plan "$T/newer.json"
expect_fail "analyze: --plan missing file" 1 "cannot open plan" "$D" analyze --device v100 --plan "$T/none.json"
# a plan is for one layer variant: a pre-LN plan refuses a post-LN layer and says how to use it
expect_ok "tune a pre-LN causal layer" "$D" tune --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8 --no-cache --reps 1 \
    --norm pre --causal --out "$T/pre.json"
expect_fail "bench: a pre-LN plan on a post-LN layer" 1 "give --norm pre --causal" "$D" bench --batch 1 --seq 4 \
    --hidden 8 --heads 2 --ffn 8 --plan "$T/pre.json"
expect_fail "bench: a plan without --recompute on a layer with it" 1 "run without --recompute" "$D" bench --batch 1 \
    --seq 4 --hidden 8 --heads 2 --ffn 8 --plan "$T/pre.json" --norm pre --causal --recompute
expect_fail "tune: --recompute with --schedule unfused" 2 "fused schedule" "$D" tune --recompute --schedule unfused
expect_ok "tune --recompute" "$D" tune --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8 --no-cache --reps 1 --recompute \
    --out "$T/rc.json"
expect_ok "bench: the --recompute plan with --recompute" "$D" bench --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8 \
    --reps 2 --warmup 1 --plan "$T/rc.json" --recompute
expect_fail "train: --recompute with --schedule unfused" 2 "fused schedule" "$D" train --layers 1 --batch 2 --seq 4 \
    --hidden 8 --heads 2 --ffn 16 --steps 2 --recompute --schedule unfused
expect_ok "bench: the pre-LN plan on its layer" "$D" bench --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8 --reps 2 \
    --warmup 1 --plan "$T/pre.json" --norm pre --causal
check "bench names the variant" grep -q "pre-LN, causal" "$T/stdout"

# train: a tiny stack; a run in two parts equals the whole run; bad options and files
trn() { "$D" train --layers 2 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --steps 6 --lr 1e-3 "$@"; }
expect_ok "dmove train --help" "$D" train --help
check "dmove train --help has an example" grep -q 'example' "$T/stdout"
expect_ok "train (tiny): checkpoint, chart" trn --warmup 2 --lr-schedule linear --save "$T/full.ckpt" --svg "$T/loss.svg"
check "train printed the loss and the time per phase" grep -q "time per step.*AdamW" "$T/stdout"
check "train printed its memory" grep -q "^memory: .*the optimizer's moments" "$T/stdout"
check "train drew the loss chart" grep -q "<polyline" "$T/loss.svg"
expect_ok "train --until 3 (the first part)" trn --warmup 2 --lr-schedule linear --save "$T/part.ckpt" --until 3
expect_ok "train --resume (the second part)" trn --warmup 2 --lr-schedule linear --save "$T/res.ckpt" --resume "$T/part.ckpt"
check "the run in two parts equals the whole run, byte for byte" cmp -s "$T/full.ckpt" "$T/res.ckpt"
# LAMB, clipped, 3 micro-batches a step, polynomial decay: in two parts too
trl() { trn --optimizer lamb --clip-norm 0.5 --accumulate 3 --lr-schedule poly --power 2 --warmup 1 "$@"; }
expect_ok "train --optimizer lamb --accumulate 3 --clip-norm" trl --save "$T/lfull.ckpt"
check "train named LAMB, the clipping and the micro-batches" grep -q "LAMB: .*clipped to 0.5, 3 micro-batches a step" "$T/stdout"
check "train printed the gradient norm" grep -q "|g| " "$T/stdout"
expect_ok "train lamb --until 3" trl --save "$T/lpart.ckpt" --until 3
expect_ok "train lamb --resume" trl --save "$T/lpart.ckpt" --resume "$T/lpart.ckpt"
check "lamb with accumulation: two parts equal the whole run, byte for byte" cmp -s "$T/lfull.ckpt" "$T/lpart.ckpt"
expect_fail "train: --resume with another --accumulate" 1 "accumulate=3" trn --optimizer lamb --clip-norm 0.5 \
    --accumulate 2 --lr-schedule poly --power 2 --warmup 1 --resume "$T/lpart.ckpt" --steps 8
expect_ok "train --recompute" trn --warmup 2 --lr-schedule linear --recompute --save "$T/rc.ckpt"
check "train --recompute: the same checkpoint, byte for byte" cmp -s "$T/full.ckpt" "$T/rc.ckpt"
expect_ok "train --json" trn --json
check "train --json printed the losses" grep -q '"loss":\[' "$T/stdout"
check "train --json printed the step's flop and rate" grep -q '"step_flop":[0-9.e+]*,"gflop_per_s":[0-9.]*,' "$T/stdout"
# train on the CUDA backend, emulated on the host (DMOVE_CUDA_EMULATE=1) where dmove has it:
# a run in two parts equals the whole run there too, and its checkpoint goes on on the CPU
trg() { DMOVE_CUDA_EMULATE=1 trn --device cuda --dtype bf16 --warmup 2 --lr-schedule linear "$@"; }
if trg --until 3 --save "$T/gpart.ckpt" >"$T/stdout" 2>"$T/stderr"; then
    expect_ok "train --device cuda --dtype bf16 (emulated)" trg --save "$T/gfull.ckpt"
    check "train on cuda said where it ran" grep -q "on the GPU (bf16 storage, emulated" "$T/stdout"
    check "train on cuda printed the GPU's memory" grep -q "^memory on the GPU: .*fp32 master weights" "$T/stdout"
    expect_ok "train --device cuda --resume (the second part)" trg --resume "$T/gpart.ckpt" --save "$T/gres.ckpt"
    check "on cuda, the run in two parts equals the whole run, byte for byte" cmp -s "$T/gfull.ckpt" "$T/gres.ckpt"
    gl=$(sed -n 's/^loss .* -> \([0-9.]*\) (step 6)$/\1/p' "$T/stdout")
    expect_ok "a cuda checkpoint resumed on the CPU" trn --warmup 2 --lr-schedule linear --resume "$T/gpart.ckpt" \
        --save "$T/cres.ckpt"
    cl=$(sed -n 's/^loss .* -> \([0-9.]*\) (step 6)$/\1/p' "$T/stdout")
    check "...its last loss within 2% of the cuda run's (bf16: $gl, CPU: $cl)" \
        awk -v g="$gl" -v c="$cl" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(g != "" && c > 0 && d < 0.02 * c) }'
    # the generated row kernels and fused attention kernels (head width 64), streams 2:
    # the losses the interpreting kernels give, to rounding
    trk() { DMOVE_CUDA_EMULATE=1 "$D" train --device cuda --dtype bf16 --layers 2 --batch 2 --seq 32 --hidden 128 \
        --heads 2 --ffn 256 --steps 3 "$@"; }
    expect_ok "train --device cuda --rows interp (emulated)" trk --rows interp
    il=$(sed -n 's/^loss .* -> \([0-9.]*\) (step 3)$/\1/p' "$T/stdout")
    expect_ok "train --device cuda --rows gen --streams 2 (emulated)" trk --rows gen --streams 2
    gnl=$(sed -n 's/^loss .* -> \([0-9.]*\) (step 3)$/\1/p' "$T/stdout")
    check "...the same last loss with the generated kernels ($gnl) as interpreted ($il)" \
        awk -v a="$gnl" -v b="$il" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b > 0 && d < 1e-3 * b) }'
else
    expect_fail "train --device cuda in a dmove without CUDA" 1 "built without CUDA" trg --until 3 --save "$OUT"
fi
st_write "$T/data" hidden_states:F32:3,4,8:077 target:F32:3,4,8 attention_mask:U8:3,4:001
expect_ok "train --data (a u8 mask)" "$D" train --data "$T/data" --layers 1 --batch 2 --heads 2 --ffn 16 --steps 2
# a mask is 0 or 1, and keeps some token
st_write "$T/data" hidden_states:F32:3,4,8:077 target:F32:3,4,8 attention_mask:I64:3,4:001
expect_fail "train --data with a mask of another value" 1 "a mask is 1 (a token) or 0 (padding)" "$D" train \
    --data "$T/data" --layers 1 --batch 2 --heads 2 --ffn 16 --steps 2
st_write "$T/data" hidden_states:F32:3,4,8:077 target:F32:3,4,8 attention_mask:I64:3,4
expect_fail "train --data with a mask of 0s" 1 "attention_mask is 0 everywhere" "$D" train --data "$T/data" \
    --layers 1 --batch 2 --heads 2 --ffn 16 --steps 2
st_write "$T/data" hidden_states:F32:3,4,8:077 target:F32:3,4,8 attention_mask:U8:3,4:001 # for the tests below
# Ctrl-C: the step under way ends, the checkpoint is written, status 130; it resumes
cases=$((cases + 1))
# (dmove itself in the background, not the function: $! must be dmove's process)
"$D" train --layers 2 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --lr 1e-3 --steps 100000000 \
    --save "$T/int.ckpt" >"$T/int.out" 2>"$T/int.err" &
tpid=$!
# signal it once it is training (its first progress line: the handlers are in place), and
# never wait for it more than a minute (training_at, ended_rc: defined here, used below too)
training_at() { k=0; while [ $k -lt 600 ] && ! grep -q '^step' "$1" 2>/dev/null; do sleep 0.1; k=$((k + 1)); done; }
ended_rc() {
    k=0
    while [ $k -lt 600 ] && kill -0 "$1" 2>/dev/null; do sleep 0.1; k=$((k + 1)); done
    kill -KILL "$1" 2>/dev/null
    wait "$1"
}
training_at "$T/int.out"
kill -INT $tpid
ended_rc $tpid
rc=$?
at=$(sed -n 's/.*interrupted after step \([0-9]*\) of.*/\1/p' "$T/int.err")
if [ $rc -eq 130 ] && [ -n "$at" ] && trn --steps 100000000 --resume "$T/int.ckpt" --until $((at + 1)) \
    --save "$T/int2.ckpt" >/dev/null 2>&1; then
    echo "ok   train: interrupted after step $at (status 130), its checkpoint resumed"
else
    fails=$((fails + 1))
    echo "FAIL train: interrupted (status $rc, step '$at')"
    sed 's/^/    /' "$T/int.err"
fi
# SIGHUP (a closed terminal or ssh session) stops the run as Ctrl-C does: its checkpoint kept
# (SIGHUP back to its default for dmove: the test itself may run under nohup)
cases=$((cases + 1))
env --default-signal=HUP "$D" train --layers 2 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --lr 1e-3 \
    --steps 100000000 --save "$T/hup.ckpt" >"$T/hup.out" 2>"$T/hup.err" &
tpid=$!
training_at "$T/hup.out"
kill -HUP $tpid
ended_rc $tpid
rc=$?
if [ $rc -eq 130 ] && grep -q "checkpoint saved to" "$T/hup.err" && [ -s "$T/hup.ckpt" ]; then
    echo "ok   train: SIGHUP ends the run with its checkpoint (status 130)"
else
    fails=$((fails + 1))
    echo "FAIL train: SIGHUP (status $rc)"
    sed 's/^/    /' "$T/hup.err"
fi
# started with SIGHUP ignored (nohup), the run keeps ignoring it; SIGINT still stops it
cases=$((cases + 1))
(trap '' HUP; exec "$D" train --layers 1 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --steps 100000000 \
    --save "$T/nohup.ckpt" >"$T/nohup.out" 2>"$T/nohup.err") &
tpid=$!
training_at "$T/nohup.out"
kill -HUP $tpid
sleep 1
alive=0
kill -0 $tpid 2>/dev/null && alive=1
kill -INT $tpid
ended_rc $tpid
rc=$?
if [ $alive = 1 ] && [ $rc -eq 130 ] && [ -s "$T/nohup.ckpt" ]; then
    echo "ok   train under nohup: SIGHUP ignored, SIGINT still ends it with its checkpoint"
else
    fails=$((fails + 1))
    echo "FAIL train under nohup (alive after HUP: $alive, status $rc)"
fi
expect_ok "train: --save and --svg both /dev/null (a device: written, never replaced)" trn --save /dev/null \
    --svg /dev/null
check "...and /dev/null is still a character device" test -c /dev/null
# a closed stdout (train | head -n 1) ends the printing, not the run: it finishes and saves
cases=$((cases + 1))
{ "$D" train --layers 1 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --lr 1e-3 --steps 600 --log-every 1 \
    --save "$T/pipe.ckpt" 2>"$T/pipe.err"; echo $? >"$T/pipe.rc"; } | head -n 1 >/dev/null
if [ "$(cat "$T/pipe.rc")" = 0 ] && grep -q "reader of its output went away" "$T/pipe.err" &&
    "$D" train --layers 1 --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 16 --lr 1e-3 --steps 600 --resume "$T/pipe.ckpt" 2>&1 |
    grep -q "at step 600, already at --steps 600"; then
    echo "ok   train | head -n 1: the run finished its 600 steps and saved"
else
    fails=$((fails + 1))
    echo "FAIL train | head -n 1 (status $(cat "$T/pipe.rc"))"
    sed 's/^/    /' "$T/pipe.err"
fi
# one output over another, or over an input, refused before any work (through a link too)
cp "$T/full.ckpt" "$T/keep.ckpt"
ln -sf "$T/keep.ckpt" "$T/link.ckpt"
expect_fail "train: --svg is --save" 2 "are the same file" trn --save "$T/s.ckpt" --svg "$T/./s.ckpt"
expect_fail "train: --save is --resume's link, --svg" 2 "is also --resume" trn --resume "$T/keep.ckpt" --svg "$T/link.ckpt"
expect_fail "train: --save over --data" 2 "is also --data" "$D" train --data "$T/data" --layers 1 --batch 2 --heads 2 \
    --ffn 16 --steps 2 --save "$T/data"
expect_fail "train: --save a directory" 2 "is a directory" trn --save "$T"
check "...the checkpoint it would have replaced is intact" cmp -s "$T/full.ckpt" "$T/keep.ckpt"
expect_ok "train: --resume C --save C (the usual way to go on)" trn --warmup 2 --lr-schedule linear --steps 8 \
    --resume "$T/keep.ckpt" --save "$T/link.ckpt"
check "...through the link: the link kept, its target the new checkpoint" test -L "$T/link.ckpt"
expect_fail "layer: --out is --plan" 2 "is also --plan" "$D" layer --in "$V" --plan "$T/keep.ckpt" --out "$T/keep.ckpt" --heads 2
expect_fail "tune: --svg is --out" 2 "are the same file" "$D" tune --out "$T/p.json" --svg "$T/p.json" --no-cache
expect_fail "tune: --cache is --out" 2 "are the same file" "$D" tune --out "$T/p.json" --cache "$T/p.json"
expect_fail "train: --steps 0" 2 "--steps" trn --steps 0
expect_fail "train: negative --lr" 2 "learning rate" trn --lr -1
expect_fail "train: warm-up as long as the run" 2 "warm-up" trn --warmup 6 --lr-schedule linear
expect_fail "train: unknown --lr-schedule" 2 "constant, linear or poly" trn --lr-schedule cosine
expect_fail "train: unknown --optimizer" 2 "adamw or lamb" trn --optimizer sgd
expect_fail "train: --power without poly" 2 "--lr-schedule poly" trn --lr-schedule linear --power 2
expect_fail "train: --lr-end without decay" 2 "linear and poly" trn --lr-end 1e-6
expect_fail "train: --lr-end above --lr" 2 "final learning rate" trn --lr-schedule poly --lr-end 1
expect_fail "train: negative --clip-norm" 2 "clip" trn --clip-norm -1
expect_fail "train: --accumulate 0" 2 "--accumulate" trn --accumulate 0
expect_fail "train: --schedule linear (the layers' schedule)" 2 "lr-schedule" trn --schedule linear
expect_fail "train: --plan with --schedule unfused" 2 "fused schedule" trn --plan "$T/p.json" --schedule unfused
expect_fail "train: --plan missing file" 1 "cannot open plan" trn --plan "$T/none.json" --save "$OUT"
expect_fail "train: --until past --steps" 2 "past --steps" trn --until 9 --save "$OUT"
expect_fail "train: --save-every without --save" 2 "needs --save" trn --save-every 2
expect_fail "train: --init and --resume" 2 "use one" trn --init "$T/full.ckpt" --resume "$T/full.ckpt"
expect_fail "train: --layers 0" 2 "--layers" trn --layers 0
expect_fail "train: --resume at its last step" 2 "already at" trn --warmup 2 --lr-schedule linear --resume "$T/full.ckpt" --save "$OUT"
expect_fail "train: --resume with another --seed" 1 "seed is 0, this run's 7" trn --warmup 2 --lr-schedule linear --seed 7 --resume "$T/part.ckpt" --save "$OUT"
expect_fail "train: --resume with another --lr" 1 "optimizer lr=" trn --resume "$T/part.ckpt" --save "$OUT"
expect_fail "train: --until without --save" 2 "needs --save" trn --until 3
expect_fail "train: --resume another architecture" 1 "ffn is 16" trn --ffn 24 --resume "$T/full.ckpt" --save "$OUT"
expect_fail "train: --resume a post-LN run as pre-LN" 1 "norm is post, this trainer's pre" trn --norm pre \
    --warmup 2 --lr-schedule linear --resume "$T/part.ckpt" --save "$OUT"
expect_fail "train: --resume a layer file" 1 "not a dmove checkpoint" trn --resume "$V" --save "$OUT"
head -c 3000 "$T/full.ckpt" >"$T/trunc.ckpt"
expect_fail "train: --resume a truncated checkpoint" 1 "truncated" trn --resume "$T/trunc.ckpt" --save "$OUT"
expect_fail "train: --init a file without layers" 1 "holds 0 layer" trn --init "$V" --save "$OUT"
# --init a Hugging Face model directory: its config.json gives the sizes (the checkpoint of
# the tiny run is a model.safetensors with BertEncoder names)
mkdir -p "$T/hfm"
cp "$T/full.ckpt" "$T/hfm/model.safetensors"
printf '{"model_type": "bert", "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16,\n "num_hidden_layers": 2}\n' >"$T/hfm/config.json"
expect_ok "train --init a model directory: the sizes from its config.json" "$D" train --init "$T/hfm" --batch 2 --seq 4 --steps 2
check "train --init took the config's 2 layers and sizes" grep -q "2 layers (i=8 h=2 u=16" "$T/stdout"
expect_ok "train --init --layers-from 1" "$D" train --init "$T/hfm" --layers-from 1 --batch 2 --seq 4 --steps 1
check "train --layers-from 1 took one layer" grep -q "1 layer (i=8" "$T/stdout"
expect_fail "train: --init with a contradicting --heads" 2 "contradicts" "$D" train --init "$T/hfm" --heads 4 --batch 2 --seq 4
expect_fail "train: --init with --preset" 2 "--preset" "$D" train --init "$T/hfm" --preset bert-base
expect_fail "train: --layers-from past the model" 2 "layers 0 to 1" "$D" train --init "$T/hfm" --layers-from 2 --batch 2 --seq 4
expect_fail "train: --layers-from without --init" 2 "needs --init" trn --layers-from 1
printf '{"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_layers": 2}' >"$T/hfm/config.json"
expect_fail "train: --init a config that contradicts the tensors" 1 "intermediate_size" "$D" train --init "$T/hfm" --batch 2 --seq 4
printf '{"model_type": "roberta"}' >"$T/hfm/config.json"
expect_fail "train: --init a RoBERTa config" 1 "model_type" "$D" train --init "$T/hfm" --batch 2 --seq 4
rm "$T/hfm/config.json" # a model directory without its config: not sized from the options
expect_fail "train: --init a directory without config.json" 1 "without config.json" "$D" train --init "$T/hfm" --batch 2 --seq 4
expect_fail "train: --data missing" 1 "cannot open" trn --data "$T/none.safetensors" --save "$OUT"
st_write "$T/notarget" hidden_states:F32:3,4,8
expect_fail "train: --data without target" 1 "target is missing" trn --data "$T/notarget" --save "$OUT"
st_write "$T/nandata" hidden_states:F32:3,4,8 target:F32:3,4,8:377
expect_fail "train: --data with NaN" 1 "NaN or infinity in sample 0" trn --data "$T/nandata" --save "$OUT"
st_write "$T/baddata" hidden_states:F32:3,4,8 target:F32:3,4,6
expect_fail "train: --data of two shapes" 1 "the same shape" trn --data "$T/baddata" --save "$OUT"
expect_fail "train: --data and another --seq" 2 "come from the file" "$D" train --data "$T/data" --seq 5 --heads 2
expect_fail "train: --data smaller than a batch" 2 "fewer than a batch" "$D" train --data "$T/data" --batch 4 --heads 2 --ffn 16
expect_fail "train: --teacher-scale with --data" 2 "teacher task" "$D" train --data "$T/data" --teacher-scale 2 --heads 2
expect_fail "train: --save into a missing directory" 1 "does not exist" trn --save "$T/no/dir/x.ckpt"
# a layer past the machine's free memory (440 GiB): refused before its pages are touched,
# not killed by the kernel while it touches them
expect_fail "train: a layer larger than the free memory" 1 "not enough memory for the layer's tensors" "$D" train \
    --batch 2048 --seq 1024 --hidden 1024 --heads 16 --ffn 4096 --layers 1 --steps 1 --threads 1

# under an address-space limit too small for OpenBLAS's buffers, a clear refusal instead of
# OpenBLAS retrying its allocation forever (it hung even --help at 300 MB). The limits are
# taken from the smallest one under which the dynamic loader can map this binary at all
# (base, found by bisection: a CUDA-linked build maps its libraries' gigabytes first; below
# that the loader itself refuses, exit 127, before any of dmove's code runs).
if [ -n "${ASAN_OPTIONS:-}" ]; then
    echo "  SKIP the address-space limit (ASan maps its shadow memory beyond any such limit)"
else
    lo=16384 hi=33554432 # KiB
    while [ $((hi - lo)) -gt 4096 ]; do
        mid=$(((lo + hi) / 2))
        (ulimit -v $mid && exec "$D" --version) >/dev/null 2>&1
        if [ $? -eq 127 ]; then lo=$mid; else hi=$mid; fi
    done
    base=$hi
    echo "  (the loader maps this dmove under ulimit -v $((base / 1024)) MiB)"
    expect_fail "--help at the loader's least address space" 1 "address-space limit" \
        sh -c 'ulimit -v "$1" && exec timeout 60 "$0" --help' "$D" "$base"
    expect_fail "a 2-thread bench with 300 MB more" 1 "address-space limit" \
        sh -c 'ulimit -v "$1" && exec timeout 60 "$0" bench --threads 2 --batch 1 --seq 8 --hidden 16 --heads 2 \
            --ffn 16 --reps 1 --warmup 0' "$D" $((base + 300000))
    expect_ok "the same bench on 1 thread with 2 GB more" \
        sh -c 'ulimit -v "$1" && exec timeout 60 "$0" bench --threads 1 --batch 1 --seq 8 --hidden 16 --heads 2 \
            --ffn 16 --reps 1 --warmup 0' "$D" $((base + 2000000))
fi

# a failed run leaves an existing OUT exactly as it was
printf 'keep me' >"$OUT"
cases=$((cases + 1))
lay --in "$T/ok" --heads 3 >/dev/null 2>"$T/stderr"
rc=$?
if [ $rc -eq 1 ] && [ "$(cat "$OUT")" = 'keep me' ]; then
    echo "ok   a failed run leaves an existing --out untouched"
else
    fails=$((fails + 1))
    echo "FAIL a failed run leaves an existing --out untouched (exit $rc)"
fi
rm -f "$OUT"

# OpenBLAS's OpenMP threads wait for one another: a team smaller than it was told
# (OMP_THREAD_LIMIT below --threads, OMP_DYNAMIC) once spun for ever; the same numbers now
"$DMOVE" example --out "$T/omp.st" --batch 1 --seq 129 --hidden 65 --heads 1 --ffn 30 >/dev/null 2>&1
DMOVE_ISA=none "$DMOVE" layer --in "$T/omp.st" --out "$T/omp_ref1.st" --threads 1 >/dev/null 2>&1
DMOVE_ISA=none "$DMOVE" layer --in "$T/omp.st" --out "$T/omp_ref2.st" --threads 2 >/dev/null 2>&1
for env in OMP_THREAD_LIMIT=1 OMP_DYNAMIC=true; do
    cases=$((cases + 1))
    env "$env" DMOVE_ISA=none timeout 120 "$DMOVE" layer --in "$T/omp.st" --out "$T/omp_$cases.st" --threads 2 \
        >/dev/null 2>&1
    rc=$?
    ref=$T/omp_ref2.st # the limit of 1: the threads it allows
    [ "$env" = OMP_THREAD_LIMIT=1 ] && ref=$T/omp_ref1.st
    if [ $rc -ne 0 ] || ! cmp -s "$ref" "$T/omp_$cases.st"; then
        echo "FAIL: layer --threads 2 under $env (BLAS): exit $rc (124: it hung), or other numbers"
        fails=$((fails + 1))
    else
        echo "ok   layer --threads 2 under $env (BLAS): the same output"
    fi
done

# a DMOVE_ISA not understood is named by every command, not ignored in silence
cases=$((cases + 1))
if DMOVE_ISA=avx1024 "$DMOVE" layer --in "$T/omp.st" --out "$T/isa.st" >/dev/null 2>"$T/stderr" &&
    grep -q "note: DMOVE_ISA='avx1024': DMOVE_ISA not understood" "$T/stderr"; then
    echo "ok   DMOVE_ISA not understood: $(grep DMOVE_ISA "$T/stderr")"
else
    echo "FAIL: layer under DMOVE_ISA=avx1024: no note"
    fails=$((fails + 1))
fi

# a checkpoint past `ulimit -f`: the write fails and says so (SIGXFSZ ignored), nothing left
cases=$((cases + 1))
(ulimit -f 20 && cd "$T" && "$DMOVE" train --layers 1 --hidden 32 --heads 2 --ffn 64 --seq 16 --batch 4 --steps 2 \
    --save big.ckpt >/dev/null 2>"$T/stderr")
rc=$?
if [ $rc -ne 1 ] || ! grep -q "File too large" "$T/stderr" || ls "$T"/big.ckpt* >/dev/null 2>&1; then
    echo "FAIL: a checkpoint past ulimit -f: exit $rc, $(head -c 200 "$T/stderr"); left: $(ls "$T" | grep big)"
    fails=$((fails + 1))
else
    echo "ok   a checkpoint past ulimit -f: $(head -1 "$T/stderr")"
fi

echo "test_cli_errors.sh: $cases cases, $fails failed"
[ $fails -eq 0 ]
