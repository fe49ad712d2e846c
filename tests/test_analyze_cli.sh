#!/bin/sh
# test_analyze_cli.sh: `dmove analyze` and `dmove probe` from the command line. Good runs
# first (table, JSON, CSV, SVG with one point per operator, a probe and analyze --device
# cpu on its profile), then bad input: each case must exit 1 (bad input) or 2 (usage),
# print a message on stderr, never crash, and leave no output file behind.
# Usage: DMOVE=build/dmove sh tests/test_analyze_cli.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
cli_setup test_analyze_cli.sh dmove_analyze

# good NAME ARGS...: must exit 0.
good() {
    name=$1
    shift
    cases=$((cases + 1))
    "$DMOVE" "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name: exit $rc (dmove $*)"
        sed 's/^/    /' "$T/stderr" >&2
    fi
}

# bad NAME CODE PATTERN ARGS...: must exit CODE with PATTERN (grep -E) on stderr, no
# output file $T/out.svg.
bad() {
    name=$1 want=$2 pat=$3
    shift 3
    cases=$((cases + 1))
    rm -f "$T/out.svg"
    "$DMOVE" "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit $rc, want $want (dmove $*)"
        sed 's/^/    /' "$T/stderr" >&2
    elif ! grep -Eq "$pat" "$T/stderr"; then
        fail "$name: stderr lacks /$pat/ (dmove $*)"
        sed 's/^/    /' "$T/stderr" >&2
    elif ls "$T"/out.svg* >/dev/null 2>&1; then
        fail "$name: left an output file behind"
    fi
}

# --- good runs ------------------------------------------------------------------------
good "table" analyze --device h100
grep -q "reduction" "$T/stdout" || fail "table: no reduction line"
grep -q "^attn_softmax " "$T/stdout" || fail "table: no attn_softmax row"
# memory: what the forward keeps (qkv and the attention probabilities among it), and the
# intermediates per plan, --recompute's fewer (a JSON check of the numbers below)
grep -q "^memory between the passes" "$T/stdout" || fail "table: no memory section"
grep -Eq "^  probs_drop +[0-9.]+ MB" "$T/stdout" || fail "table: probs_drop not among what the forward keeps"
# (a datasheet device: the memory does not depend on it, and --device cpu needs the profile
# `dmove probe` writes under $HOME, which a fresh machine lacks)
good "memory in JSON" analyze --device h100 --json
# (no Python in CI: the numbers by sed, compared by awk)
jv() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.e+]*\).*/\1/p" "$T/stdout" | head -1; }
probs=$(grep -A1 '"tensor":[[:space:]]*"probs"' "$T/stdout" | sed -n 's/.*"bytes":[[:space:]]*\([0-9.e+]*\).*/\1/p')
# BERT-base fp32: probs (b, h, j, k) = 8*12*128*128 floats; --recompute holds fewer intermediates
awk -v p="$probs" -v f="$(jv intermediates_fused_bytes)" -v u="$(jv intermediates_unfused_bytes)" \
    -v r="$(jv intermediates_recompute_bytes)" -v s="$(jv saved_for_backward_bytes)" \
    'BEGIN { exit !(p == 8 * 12 * 128 * 128 * 4 && f > 0 && f <= u && r < f && s > p) }' ||
    fail "JSON: memory numbers inconsistent (probs $probs, $(jv intermediates_fused_bytes) fused)"
# --recompute: the recompute plan's groups (the clones inside the backward attention group),
# fewer bytes, the recomputed flop (QK^T, mask, softmax, dropout: BERT-base b=8 j=128
# fp32: 2 b h j^2 p = 0.201 GFLOP for QK^T, 0.215 in all) in the table and the JSON
good "--recompute" analyze --device h100 --recompute
grep -q "fused groups (attention recomputed in the backward)" "$T/stdout" &&
    grep -q "attn_scores_re attn_mask_re attn_softmax_re attn_probs_dropout_re" "$T/stdout" &&
    grep -q "(attention recomputed: +0.215 GFLOP" "$T/stdout" || fail "--recompute: no recomputed group or flop"
good "--recompute, JSON" analyze --device h100 --recompute --json
rb=$(jv fused_bytes) rf=$(jv recomputed_flop)
# its memory section still names the plain fused plan's intermediates as "fused"
awk -v f="$(jv intermediates_fused_bytes)" -v r="$(jv intermediates_recompute_bytes)" 'BEGIN { exit !(f > r && r > 0) }' ||
    fail "--recompute, JSON: intermediates fused $(jv intermediates_fused_bytes), recompute $(jv intermediates_recompute_bytes)"
good "without --recompute, JSON" analyze --device h100 --json
awk -v rb="$rb" -v b="$(jv fused_bytes)" -v rf="$rf" -v f="$(jv recomputed_flop)" \
    'BEGIN { exit !(rb > 0 && rb < b && rf > 2.01e8 && rf < 2.2e8 && f == 0) }' ||
    fail "--recompute, JSON: fused bytes $rb (without: $(jv fused_bytes)), recomputed flop $rf"
# a fused plan from `dmove tune` lays out tensors the fused schedule's rewrites add
# (ffn_act_deriv): analyze builds its fused plan on that graph, so it shows them
if "$DMOVE" tune --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --reps 1 --no-cache --threads 2 \
    --out "$T/tiny-plan.json" >"$T/tune.txt" 2>&1; then
    # input/weight-gradient pairs are timed side by side (kept or not, and how many after
    # one is kept apart: timing)
    [ "$(grep -c -E 'proj_dA +\+ .*proj_dB .*(side by side|kept apart)' "$T/tune.txt")" -ge 1 ] ||
        fail "tune: no side-by-side pair timed"
    good "plan from tune" analyze --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --device v100 \
        --plan "$T/tiny-plan.json"
    grep -q "^  ffn_act_deriv " "$T/stdout" || fail "plan from tune: ffn_act_deriv not shown"
    # pairs kept side by side (forced by the test hook: at these sizes they never win) are
    # shown with their partners, and the plan runs
    if DMOVE_TEST_PAIRS=keep "$DMOVE" tune --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --reps 1 --no-cache \
        --threads 2 --out "$T/pairs-plan.json" >/dev/null 2>&1 && grep -q '"concurrent"' "$T/pairs-plan.json"; then
        good "plan with pairs" analyze --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --device v100 \
            --plan "$T/pairs-plan.json"
        grep -q "^  ffn_out_proj_dA .*concurrent  (ffn_out_proj_dB runs beside it)" "$T/stdout" &&
            grep -q "^  qkv_proj_dB .*(runs beside qkv_proj_dA; its own algorithm applies alone)" "$T/stdout" ||
            fail "plan with pairs: a pair not shown with its partner"
        # every algorithm of the plan is listed (also a contraction inside a fused group)
        for op in $(sed -n '/"algorithms"/,/}/p' "$T/pairs-plan.json" | grep -o '"[A-Za-z_]*":' | tr -d '":' | grep -v '^algorithms$'); do
            grep -q "^  $op " "$T/stdout" || fail "plan with pairs: algorithm of $op not listed"
        done
        good "plan with pairs, JSON" analyze --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --device v100 \
            --plan "$T/pairs-plan.json" --json
        tr -d ' \t\n' <"$T/stdout" | grep -q '"side_by_side":\[{"first":"ffn_out_proj_dA","beside":"ffn_out_proj_dB"}' ||
            fail "plan with pairs, JSON: no side_by_side list"
        good "bench a plan with pairs" bench --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --threads 2 \
            --schedule fused --reps 2 --warmup 1 --groups --plan "$T/pairs-plan.json"
        grep -q "qkv_proj_dB  (timed with qkv_proj_dA, its floor counted there)" "$T/stderr" ||
            fail "bench a plan with pairs: no pair in --groups"
    else
        cases=$((cases + 1))
        fail "plan with pairs: dmove tune with DMOVE_TEST_PAIRS=keep wrote no concurrent pair"
    fi
    good "plan from tune, JSON" analyze --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8 --device v100 \
        --plan "$T/tiny-plan.json" --json
    grep -q '"plan"' "$T/stdout" && grep -q '"ffn_act_deriv":' "$T/stdout" && grep -q '"algorithms"' "$T/stdout" ||
        fail "plan from tune, JSON: no plan object with its layouts and algorithms"
    grep -q "ffn_act_deriv" "$T/stderr" && fail "plan from tune, JSON: the table went to stderr too"
else
    cases=$((cases + 1))
    fail "plan from tune: dmove tune failed"
fi
good "json" analyze --device a100 --dtype bf16 --json --batch 2 --seq 32
grep -q '"ops"' "$T/stdout" && grep -q '"groups"' "$T/stdout" && grep -q '"predicted_seconds"' "$T/stdout" ||
    fail "json: missing keys"
good "csv" analyze --device v100 --csv --preset bert-large
nops=$(($(wc -l <"$T/stdout") - 1))
head -1 "$T/stdout" | grep -q '^name,kind,pass,class,flop,' || fail "csv: header"
[ "$nops" -gt 30 ] || fail "csv: only $nops rows"
good "svg" analyze --device h200 --preset bert-large --svg "$T/roof.svg"
[ -s "$T/roof.svg" ] || fail "svg: no file"
npts=$(grep -c '<circle class="op ' "$T/roof.svg")
[ "$npts" -eq "$nops" ] || fail "svg: $npts points for $nops ops"
ls "$T"/roof.svg.tmp* >/dev/null 2>&1 && fail "svg: temporary file left behind"
good "help" analyze --help
good "probe" probe --threads 1 --profile "$T/prof/cpu-profile.json"
[ -s "$T/prof/cpu-profile.json" ] || fail "probe: no profile written"
good "cpu" analyze --device cpu --profile "$T/prof/cpu-profile.json" --batch 2 --seq 32
grep -q "measured by dmove probe" "$T/stdout" || fail "cpu: device not from the profile"
# the CPU's default runs the attention as one op, a tuned plan its ops: a plan from tune
# applies on the CPU's rates too, and the analysis then shows the attention's ops
good "cpu" analyze --device cpu --profile "$T/prof/cpu-profile.json" --batch 2 --seq 4 --hidden 8 --heads 2 --ffn 8
grep -q "^ *[0-9][0-9]* bwd  contraction .* attn_bwd$" "$T/stdout" &&
    ! grep -q "^ *[0-9][0-9]* fwd .* attn_softmax" "$T/stdout" || fail "cpu: the default's attention not one op"
if [ -s "$T/tiny-plan.json" ]; then
    good "plan from tune, cpu" analyze --device cpu --profile "$T/prof/cpu-profile.json" --batch 2 --seq 4 \
        --hidden 8 --heads 2 --ffn 8 --plan "$T/tiny-plan.json"
    grep -q "^  probs_drop " "$T/stdout" && grep -q "^ *[0-9][0-9]* fwd .* attn_softmax" "$T/stdout" ||
        fail "plan from tune, cpu: the attention's ops not shown"
fi
# the default profile path: $XDG_CACHE_HOME/dmove/cpu-profile.json
XDG_CACHE_HOME=$T/prof-xdg "$DMOVE" probe --threads 1 >/dev/null 2>&1 || fail "probe to XDG_CACHE_HOME"
[ -s "$T/prof-xdg/dmove/cpu-profile.json" ] || fail "probe: not in XDG_CACHE_HOME"
XDG_CACHE_HOME=$T/prof-xdg "$DMOVE" analyze --batch 1 --seq 8 --hidden 16 --heads 2 --ffn 32 \
    >/dev/null 2>&1 || fail "analyze with the XDG default profile"
# a fresh machine: no profile at the default path, so analyze measures one, says so, saves it
XDG_CACHE_HOME=$T/prof-fresh "$DMOVE" analyze --threads 1 --batch 1 --seq 8 --hidden 16 --heads 2 --ffn 32 \
    >"$T/stdout" 2>"$T/stderr" || fail "analyze on a machine without a profile"
grep -q "measuring this CPU now" "$T/stderr" || fail "analyze without a profile: no note that it probes"
grep -q "measured by dmove probe" "$T/stdout" || fail "analyze without a profile: device not from the probe"
[ -s "$T/prof-fresh/dmove/cpu-profile.json" ] || fail "analyze without a profile: the profile not saved"

# bench --groups holds each group to a roofline: one line per group with its floor and
# ratio, then the time above the floors by class and the largest gaps; in JSON, every
# group with its floor; the CPU's model from the default profile; none: no floors
tiny="--batch 2 --seq 8 --hidden 16 --heads 2 --ffn 32 --schedule fused --reps 1 --warmup 0 --threads 1 --groups"
# shellcheck disable=SC2086 # $tiny is a list of options
good "bench groups h100" bench $tiny --roofline h100
grep -q "^fused: groups, times of 1 profiled step (each group waited for), against the roofline of h100" "$T/stderr" &&
    grep -Eq "^forward  contraction +[0-9.]+ +[0-9.e+-]+ +[0-9.]+  qkv_proj$" "$T/stderr" &&
    grep -Eq "^backward contraction +[0-9.]+ +[0-9.e+-]+ +[0-9.]+  qkv_proj_dB$" "$T/stderr" &&
    grep -q "^fused against the roofline (h100): the groups took" "$T/stderr" &&
    grep -Eq "^normalization +[0-9.]+ +[0-9.]+ " "$T/stderr" && grep -q "^largest gaps to the floor:" "$T/stderr" ||
    fail "bench groups h100: no group table against the roofline"
[ "$(grep -cE "^(forward|backward) " "$T/stderr")" -eq 23 ] || fail "bench groups h100: not 23 groups"
# shellcheck disable=SC2086
good "bench groups json" bench $tiny --roofline a100 --json
tr -d ' \t\n' <"$T/stdout" | grep -q '"roofline":{"device":"a100",' || fail "bench groups json: no roofline object"
[ "$(grep -c '"floor_ms":' "$T/stdout")" -eq 24 ] || fail "bench groups json: not 23 groups with floors (+ the total)"
tr -d ' \t\n' <"$T/stdout" | grep -q '"floor_ms":0[,}]' && fail "bench groups json: a group with a zero floor"
# shellcheck disable=SC2086
XDG_CACHE_HOME=$T/prof-xdg "$DMOVE" bench $tiny >"$T/stdout" 2>"$T/stderr" &&
    grep -q "against the roofline of cpu" "$T/stderr" || fail "bench groups: not the CPU's model from the profile"
# shellcheck disable=SC2086
XDG_CACHE_HOME=$T/no-prof "$DMOVE" bench $tiny >"$T/stdout" 2>"$T/stderr" &&
    grep -q "no roofline floors: no CPU profile .*dmove probe" "$T/stderr" ||
    fail "bench groups: without a profile, no note on dmove probe"
# --svg (implies --groups): the chart, a bar per group of each schedule
good "bench groups svg" bench --batch 2 --seq 8 --hidden 16 --heads 2 --ffn 32 --reps 1 --warmup 0 --threads 1 \
    --roofline h100 --svg "$T/groups.svg"
head -c 200 "$T/groups.svg" | grep -q "<svg" && [ "$(grep -c '<rect class="group ' "$T/groups.svg")" -eq 68 ] &&
    grep -q "^fused against the roofline (h100)" "$T/stderr" ||
    fail "bench groups svg: not 23 + 45 bars (fused, unfused), or no table"
# shellcheck disable=SC2086
good "bench groups none" bench $tiny --roofline none --json
tr -d ' \t\n' <"$T/stdout" >"$T/flat"
grep -q '"roofline":null,"roofline_note":"--rooflinenone"' "$T/flat" && grep -q '"floor_ms":null' "$T/flat" &&
    ! grep -q '"floor_ms":[0-9]' "$T/flat" || fail "bench groups none: floors in the JSON"
cases=$((cases + 3))
# tune sets its verified steps against the same fused floor analyze reports (the profile
# at the default path), and without a profile says how to get one
S="--batch 2 --seq 32 --hidden 64 --heads 2 --ffn 128 --threads 1"
cases=$((cases + 2))
if XDG_CACHE_HOME=$T/prof-xdg "$DMOVE" tune $S --reps 1 --verify 1 --no-cache --out "$T/floor-plan.json" \
    >"$T/tune.out" 2>/dev/null &&
    XDG_CACHE_HOME=$T/prof-xdg "$DMOVE" analyze $S >"$T/analyze.out" 2>/dev/null; then
    want=$(awk '$1 == "fused" && /roofline floor/ { print $(NF - 1) }' "$T/analyze.out")
    # (either form: the floor, or the floor the step beat, when the probe ran on a busy machine)
    got=$(sed -n 's/^roofline floor of the fused step [^:]*: \([0-9.]*\) ms[;,] .*/\1/p' "$T/tune.out")
    awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; exit !(b != "" && a > 0 && d < 0.006 && d > -0.006) }' ||
        fail "tune floor: '$got' ms, analyze says '$want' ms"
else
    fail "tune floor: tune or analyze failed"
fi
mkdir -p "$T/prof-none"
if XDG_CACHE_HOME=$T/prof-none "$DMOVE" tune $S --reps 1 --verify 1 --no-cache --out "$T/floor-plan.json" \
    >"$T/tune.out" 2>/dev/null; then
    grep -q 'run `dmove probe` once' "$T/tune.out" || fail "tune without a profile: no hint to run dmove probe"
else
    fail "tune without a profile failed"
fi
good "measure" analyze --measure --reps 1 --profile "$T/prof/cpu-profile.json" \
    --batch 1 --seq 16 --hidden 32 --heads 2 --ffn 64 --threads 1
grep -q "MUE" "$T/stdout" || fail "measure: no MUE column"

# --- the whole model: analyze --model ------------------------------------------------
good "--model" analyze --model --device h100
for part in embeddings "encoder layers" "MLM head" optimizer "whole model"; do
    grep -q "^$part " "$T/stdout" || fail "--model: no row for $part"
done
good "--model, JSON" analyze --model --device h100 --json
# the values of a key, in order: the four parts (embeddings, layers, head, optimizer), then the total
tr ',{}[]' '\n\n\n\n\n' <"$T/stdout" >"$T/flat"
vals() { sed -n "s/^\"$1\":[[:space:]]*\([0-9.e+-]*\)$/\1/p" "$T/flat" | tr '\n' ' '; }
# BERT-base (i=768 u=3072 V=30522 P=512 T=2, 12 layers), b=8 j=128: parameters counted by hand (as
# transformers' BertForMaskedLM has them, the decoder tied: 109514298); the contraction flop of a
# layer: forward 2 n (4 i^2 + 2 i u) + 4 b j^2 i (scores and context), backward twice that; the
# head's at its M = b ceil(j / 5) = 208 scored rows: 3 * 2 M (i^2 + i V); the whole model's flop
# the sum of its parts'; and within 5% above 6 * parameters * tokens (the tied decoder at the M
# rows), the attention's j^2 terms and the rest being the difference
awk -v p="$(vals params)" -v f="$(vals flop)" -v c="$(vals contraction)" -v six="$(vals six_params_tokens_flop)" 'BEGIN {
    split(p, P, " "); split(f, F, " "); split(c, C, " ")
    i = 768; u = 3072; V = 30522; L = 12; n = 8 * 128; M = 208
    emb = V * i + 512 * i + 2 * i + 2 * i
    lay = 4 * i * i + 4 * i + 2 * i * u + u + i + 4 * i
    head = i * i + i + 2 * i + V
    lc = 3 * (2 * n * (4 * i * i + 2 * i * u) + 4 * 8 * 128 * 128 * i)
    hc = 3 * 2 * M * (i * i + i * V)
    want6 = 6 * (emb + L * lay + head - V * i) * n + 6 * V * i * M
    ok = P[1] == emb && P[2] == L * lay && P[3] == head && P[5] == emb + L * lay + head && P[5] == 109514298
    ok = ok && C[2] == L * lc && C[3] == hc && C[1] == 0
    s = F[1] + F[2] + F[3] + F[4]; d = s - F[5]
    ok = ok && d < 1e-9 * F[5] && d > -1e-9 * F[5] && six == want6 && F[5] > six && F[5] < 1.05 * six
    exit !ok }' || fail "--model, JSON: parameters ($(vals params)), contraction flop ($(vals contraction)) or flop ($(vals flop); 6NT $(vals six_params_tokens_flop)) not as counted"
# the layers part is the layer `dmove analyze` analyses, L times
good "one layer, JSON" analyze --device h100 --json
one=$(tr -d ' \t\n' <"$T/stdout" | sed -n 's/.*"totals":{"flop":\([0-9.e+]*\).*/\1/p')
good "--model --layers 3, JSON" analyze --model --layers 3 --device h100 --json
tr ',{}[]' '\n\n\n\n\n' <"$T/stdout" >"$T/flat"
awk -v one="$one" -v f="$(vals flop)" 'BEGIN { split(f, F, " "); exit !(one > 0 && F[2] == 3 * one) }' ||
    fail "--model --layers 3: the layers' flop $(vals flop) is not 3 x one layer's ($one)"
# --config: a small model's sizes, layers and tables from a Hugging Face config.json
cat >"$T/config.json" <<'JSON'
{"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 1000, "hidden_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "hidden_act": "gelu",
 "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
 "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute"}
JSON
good "--model --config" analyze --model --config "$T/config.json" --device h100 --json
tr ',{}[]' '\n\n\n\n\n' <"$T/stdout" >"$T/flat"
# 1000*64 + 512*64 + 2*64 + 2*64 = 97024; a layer 4*64^2 + 4*64 + 2*64*128 + 128 + 64 + 4*64 = 33472;
# the head 64^2 + 64 + 2*64 + 1000 = 5288: 97024 + 2 * 33472 + 5288 = 169256
[ "$(vals params)" = "97024 66944 5288 0 169256 " ] && grep -q '"layers":2,"hidden":64,"heads":4,"ffn":128,"vocab":1000' "$T/stdout" ||
    fail "--model --config: parameters $(vals params), not those of the config"
# bench --model times that step: each part's contraction flop are analyze --model's (the
# same graphs; the fused rewrite changes only element-wise flop)
small="--layers 2 --hidden 64 --heads 2 --ffn 128 --batch 4 --seq 32 --vocab 1000"
# shellcheck disable=SC2086
good "--model, small, JSON" analyze --model $small --device h100 --json
tr ',{}[]' '\n\n\n\n\n' <"$T/stdout" >"$T/flat"
want=$(vals contraction | cut -d' ' -f1-3)
# shellcheck disable=SC2086
good "bench --model" bench --model $small --reps 2 --warmup 1 --threads 2
for part in embeddings "encoder layers (2)" "MLM head" optimizer step; do
    grep -q "^$part " "$T/stdout" || fail "bench --model: no row for $part"
done
grep -q "up to 28 masked positions scored, AdamW" "$T/stdout" || fail "bench --model: not 4 ceil(32/5) = 28 positions, AdamW"
# shellcheck disable=SC2086
good "bench --model, JSON, groups" bench --model $small --reps 2 --warmup 1 --threads 2 --json --groups --roofline h100
tr -d '\t\n' <"$T/stdout" | tr ',{}[]' '\n\n\n\n\n' >"$T/flat"
got=$(sed -n 's/^"part":[[:space:]]*"\(.*\)"$/\1/p' "$T/flat" | tr '\n' '|')
[ "$got" = "embeddings|encoder layers|MLM head|optimizer|" ] || fail "bench --model JSON: parts $got"
# the parts' contraction flop, in order
bflop=$(vals flop_contraction | cut -d' ' -f1-3)
awk -v w="$want" -v b="$bflop" 'BEGIN { n = split(w, W, " "); split(b, B, " ")
    ok = n == 3; for (k = 1; k <= n; k++) ok = ok && B[k] == W[k]; exit !ok }' ||
    fail "bench --model: contraction flop by part $bflop, analyze --model's $want"
grep -q "^MLM head: groups" "$T/stderr" && grep -q "^encoder layers (a layer: the mean of 2): groups" "$T/stderr" ||
    fail "bench --model --groups: no group tables for the head and a layer"
# shellcheck disable=SC2086
good "bench --model, LAMB" bench --model $small --lamb --predictions 10 --reps 1 --warmup 0 --threads 1
grep -q "up to 10 masked positions scored, LAMB" "$T/stdout" || fail "bench --model --lamb --predictions 10: not in the header"
bad "bench --layers without --model" 2 "add --model" bench --layers 3
bad "bench --model --plan" 2 "are for a layer" bench --model --plan "$T/nope.json"
bad "bench --model --schedule" 2 "are for a layer" bench --model --schedule unfused
bad "--model options without --model" 2 "are .-model.s" analyze --layers 3 --device h100
bad "--config with --layers" 2 "leave out --layers" analyze --model --config "$T/config.json" --layers 4 --device h100
bad "--model --csv" 2 "model reports a table" analyze --model --csv --device h100
bad "--model positions below seq" 2 "positions 64" analyze --model --positions 64 --device h100
bad "--model missing config" 1 "config" analyze --model --config "$T/nope.json" --device h100

# --- bad input ------------------------------------------------------------------------
printf '{"version": 1, "machine": {}' >"$T/trunc.json"
printf 'not json at all' >"$T/garbage.json"
printf '{"version": 1, "machine": {}, "threads": 2, "bandwidth_gbs": {"triad": 0, "read": 1}, "vector_gflops": 1, "sgemm_n": 8, "sgemm": [{"threads": 1, "gflops": 1}]}' >"$T/zero.json"
printf '{"version": 7}' >"$T/version.json"
cp "$T/prof/cpu-profile.json" "$T/noperm.json" && chmod 000 "$T/noperm.json"
mkdir -p "$T/adir.json"

bad "unknown preset" 2 "unknown preset 'bert-xl'" analyze --preset bert-xl --device h100
bad "zero batch" 2 "batch" analyze --batch 0 --device h100
bad "zero seq" 2 "seq" analyze --seq 0 --device h100
bad "zero hidden" 2 "hidden" analyze --hidden 0 --device h100
bad "zero heads" 2 "heads" analyze --heads 0 --device h100
bad "zero ffn" 2 "ffn" analyze --ffn 0 --device h100
bad "negative batch" 2 "batch" analyze --batch -3 --device h100
bad "not divisible" 2 "divisible" analyze --hidden 100 --heads 3 --device h100
bad "overflow" 2 "." analyze --batch 9223372036854775807 --seq 9223372036854775807 --device h100
bad "unknown device" 2 "unknown device 'tpu'.*h100" analyze --device tpu
bad "empty device" 2 "unknown device" analyze --device ""
bad "unknown dtype" 2 "unknown dtype 'int8'" analyze --device h100 --dtype int8
bad "missing profile" 1 "dmove probe" analyze --device cpu --profile "$T/nope.json"
bad "truncated profile" 1 "malformed" analyze --profile "$T/trunc.json"
bad "garbage profile" 1 "malformed" analyze --profile "$T/garbage.json"
bad "zero bandwidth" 1 "triad" analyze --profile "$T/zero.json"
bad "profile version" 1 "version" analyze --profile "$T/version.json"
bad "profile is a directory" 1 "profile" analyze --profile "$T/adir.json"
if [ "$(id -u)" != 0 ]; then
    bad "unreadable profile" 1 "cannot read" analyze --profile "$T/noperm.json"
fi
bad "empty profile name" 2 "empty" analyze --profile ""
bad "measure on a GPU" 2 "device cpu" analyze --device h100 --measure
bad "measure bf16" 2 "fp32" analyze --dtype bf16 --measure
bad "json and csv" 2 "choose one" analyze --device h100 --json --csv
bad "svg no dir" 1 "cannot" analyze --device h100 --svg "$T/no/such/dir/out.svg"
bad "svg value missing" 2 "svg" analyze --device h100 --svg
bad "reps zero" 2 "reps" analyze --reps 0
bad "unknown option" 2 "unknown option '--frob'" analyze --frob
bad "stray argument" 2 "unexpected argument" analyze extra
bad "flag with value" 2 "json" analyze --json=yes
bad "bench roofline unknown" 2 "unknown device model 'tpu'.*none" bench --roofline tpu
bad "bench roofline missing" 2 "roofline" bench --roofline
bad "bench svg into a missing directory" 1 "svg" bench --batch 1 --seq 4 --hidden 8 --heads 2 --ffn 8 --svg "$T/no/dir/g.svg"
bad "probe threads" 2 "threads" probe --threads 0
# bench --lengths: the padded against the unpadded layer on batches of drawn lengths
lens="--batch 4 --seq 16 --hidden 32 --heads 2 --ffn 64 --reps 2 --warmup 1 --threads 2"
# shellcheck disable=SC2086
good "bench --lengths uniform" bench $lens --lengths uniform:4-12
grep -q "^padded " "$T/stdout" && grep -q "^unpadded " "$T/stdout" && grep -q "^unpadded speedup" "$T/stdout" ||
    fail "bench --lengths: no padded and unpadded rows, or no speedup"
# the attention alone (its ATTN and ATTN_BWD groups, profiled), saying what ran it
for pass in forward backward; do
    grep -Eq "^unpadded attention $pass: [0-9.]+ ms, [0-9.]+ TFLOP/s of the real tokens \(last batch, the CPU's kernel\)$" \
        "$T/stdout" || fail "bench --lengths: no line for the attention's $pass"
done
fill=$(sed -n 's/^fill (real tokens \/ b x j): \([0-9.]*\).*/\1/p' "$T/stdout")
awk -v f="$fill" 'BEGIN { exit !(f >= 0.25 && f <= 0.75) }' || fail "bench --lengths uniform:4-12 of 16: fill $fill"
printf '3 5 # a comment\n40\n\n7\n' >"$T/lens.txt"
# shellcheck disable=SC2086
good "bench --lengths file, JSON" bench $lens --lengths "$T/lens.txt" --json
tr -d ' \t\n' <"$T/stdout" | grep -q '"unpadded_speedup":' || fail "bench --lengths --json: no unpadded_speedup"
# the attention's times, and its flop of the last batch's real tokens: 4 i sum L^2 forward, twice that backward
python3 - "$T/stdout" <<'PY' || fail "bench --lengths --json: the attention's fields"
import json, sys
r = json.load(open(sys.argv[1]))
f, b = r["attention_forward_flop"], r["attention_backward_flop"]
assert r["attention_forward_ms"] > 0 and r["attention_backward_ms"] > 0, r
assert f > 0 and b == 2 * f and f % (4 * 32) == 0, (f, b)
assert r["attention_flash_groups"] == 0 and r["padded_attention_flash_groups"] == 0, r
PY
{ printf '# '; head -c 9000 /dev/zero | tr '\0' 'x'; printf ' 99999\n5\n'; } >"$T/longlens.txt"
# shellcheck disable=SC2086
good "bench --lengths file with a long comment line" bench $lens --lengths "$T/longlens.txt"
grep -q "^fill (real tokens / b x j): 0.312" "$T/stdout" || fail "bench --lengths long line: the comment's digits were read"
bad "bench --lengths --roofline" 2 "leave out --model" bench $lens --lengths uniform:4-8 --roofline h100
printf '3\nfive\n' >"$T/badlens.txt"
bad "bench --lengths bad file" 1 "badlens.txt line 2: 'five' is no length" bench $lens --lengths "$T/badlens.txt"
bad "bench --lengths no file" 1 "cannot open" bench $lens --lengths "$T/none.txt"
bad "bench --lengths uniform above seq" 2 "uniform:LO-HI with 1 <= LO <= HI <= --seq" bench $lens --lengths uniform:4-17
bad "bench --lengths uniform reversed" 2 "uniform:LO-HI" bench $lens --lengths uniform:9-3
bad "bench --lengths --model" 2 "leave out --model" bench --model --lengths uniform:1-4
bad "probe unknown" 2 "unknown option" probe --fast
ls "$T"/no >/dev/null 2>&1 && fail "svg no dir: created a directory"

echo "test_analyze_cli.sh: $cases cases, $fails failed"
[ "$fails" -eq 0 ]
