#!/bin/sh
# bench/gpu/probe_attn.sh: where the flash kernels' time goes (a short device call): the
# unpadded attention's forward and backward alone (`dmove bench --lengths` at full fill) with
# dropout 0.1 and 0 (the Philox words' share), BERT-large heads, b=96 j=128 and b=8 j=512;
# then the padded layer's groups with its attention as ops (DMOVE_CUDA_ATTN_OP=0) at b=96
# j=128 (what the flash op must beat). PROBE=live instead: the unpadded layer at half fill
# with lengths the same every batch and varying, the live rows' rounding with the weight
# gradients' k too (the default, DMOVE_CUDA_LIVE_ROUND_K=1), without it (=0) and off
# (DMOVE_CUDA_LIVE_ROUND=1): whether new token counts still cost (b=8 j=512). PROBE=ncu:
# Nsight Compute's view of each flash kernel (throughput, occupancy, stall reasons; NCU_OUT=DIR:
# ncu's whole report of each in DIR/ncu-KERNEL.txt too).
# With .dev unpacked (session.sh's): DMOVE=.dev/bin/dmove
set -u
DMOVE=${DMOVE:-.dev/bin/dmove}
if [ "${PROBE:-attn}" = ncu ]; then
    # where the flash kernels' time goes: Nsight Compute on each (forward, dK
    # dV, dQ) in an unpadded BERT-large step at b=8 j=512 full fill, dropout 0.1: the first
    # three launches of each, reported one after the other (a launch of a few microseconds
    # ran on no tokens; read the others): throughput against the SM's
    # and memory's, occupancy, the warps' stall reasons; with NCU_OUT=DIR, ncu's whole
    # report per kernel (DIR/ncu-KERNEL.txt), its SASS with the stall samples per
    # instruction (DIR/ncu-KERNEL-sass.csv) and the kernels' SASS (DIR/sass.txt, cuobjdump)
    command -v ncu >/dev/null 2>&1 || { echo "probe_attn.sh: no ncu on this machine"; exit 0; }
    rep=$(mktemp -d)
    # --rows gen: no --rows auto, whose warm-up runs every group on the zeroed arena first
    bench="bench --device cuda --dtype bf16 --rows gen --preset bert-large --batch 8 --seq 512 --lengths uniform:512-512 --reps 2 --warmup 2"
    for kn in fl_fwd_kernel fl_bwd_kernel fl_dq_kernel; do
        echo "== ncu $kn"
        # shellcheck disable=SC2086 # bench is words
        timeout 60 ncu --clock-control none -k "regex:$kn" --launch-count 3 --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats --section SourceCounters \
            -o "$rep/$kn" "$DMOVE" $bench >/dev/null 2>&1 || echo "ncu $kn: exit $?"
        ncu -i "$rep/$kn.ncu-rep" --page details 2>&1 | tee "${NCU_OUT:-/dev/null}${NCU_OUT:+/ncu-$kn.txt}" |
            grep -iE "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|stall|Warp Cycles|Issue Slots|Executed Ipc|Dynamic Shared|Grid Size" |
            tr -s ' ' | head -120
        [ -n "${NCU_OUT:-}" ] && { ncu -i "$rep/$kn.ncu-rep" --page source --print-source sass --csv \
            >"$NCU_OUT/ncu-$kn-sass.csv" 2>&1 || echo "ncu $kn source page: exit $?"; }
    done
    rm -rf "$rep"
    if [ -n "${NCU_OUT:-}" ] && command -v cuobjdump >/dev/null 2>&1; then
        cuobjdump -sass "$DMOVE" 2>&1 | awk '/Function : .*fl_(fwd|bwd|dq)_kernel/ {p = 1} /Function : / && !/fl_(fwd|bwd|dq)_kernel/ {p = 0} p' \
            >"$NCU_OUT/sass.txt"
        echo "cuobjdump: $(grep -c 'Function :' "$NCU_OUT/sass.txt") flash kernels' SASS in $NCU_OUT/sass.txt"
    fi
    exit 0
fi
if [ "${PROBE:-attn}" = live ]; then
    # "64 k": the weight gradients' k (the tokens) rounded too, over zeroed rows
    # (DMOVE_CUDA_LIVE_ROUND_K=1): if new shapes are what costs, they cost there too
    for r in "64 k" 64 1; do
        k=0
        [ "${r#* }" = k ] && k=1
        for v in uniform:128-384 uniform:256-256; do
            echo "DMOVE_CUDA_LIVE_ROUND=${r% *} DMOVE_CUDA_LIVE_ROUND_K=$k $v: $(DMOVE_CUDA_LIVE_ROUND=${r% *} \
                DMOVE_CUDA_LIVE_ROUND_K=$k timeout 60 "$DMOVE" bench --device cuda \
                --dtype bf16 --preset bert-large --batch 8 --seq 512 --lengths "$v" --reps 20 --warmup 5 2>&1 |
                grep -E '^padded |^unpadded' | tr -s ' ' | tr '\n' ';')"
        done
    done
    exit 0
fi
for s in 96x128 8x512; do
    b=${s%x*} j=${s#*x}
    for p in 0.1 0; do
        echo "b=$b j=$j dropout $p: $(timeout 60 "$DMOVE" bench --device cuda --dtype bf16 --preset bert-large \
            --batch "$b" --seq "$j" --dropout "$p" --lengths "uniform:$j-$j" --reps 10 --warmup 3 2>&1 |
            grep -E '^padded |^unpadded |^unpadded attention' | tr -s ' ' | tr '\n' ';')"
    done
done
echo "== the padded layer's attention as its ops, b=96 j=128: its attention groups"
DMOVE_CUDA_ATTN_OP=0 timeout 60 "$DMOVE" bench --device cuda --dtype bf16 --preset bert-large --batch 96 --seq 128 \
    --schedule fused --groups --reps 10 --warmup 3 2>&1 | grep -E "attn|scores|probs|context|groups took" | head -16
