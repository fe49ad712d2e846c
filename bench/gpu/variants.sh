#!/bin/sh
# bench/gpu/variants.sh: the flash kernels' compile-time variants side by side, in one device
# call (each start of a GPU machine costs minutes of a short budget: build here, time there).
#   here:  sh bench/gpu/variants.sh build NAME=FLAGS ...
#          e.g. sh bench/gpu/variants.sh build dq4=-DFL_DQ_MINB=4 fwd3=-DFL_FWD_MINB=1
#          builds dmove once per variant (src/cuda/flash.cu again with NVCC_EXTRA=FLAGS, the
#          rest as built), strips each into .dev/alt/dmove-NAME, packs them as .dev/alt.tar.xz
#          (git-ignored; carry .dev with pack.sh's archive) and rebuilds the default
#   there: sh bench/gpu/variants.sh run [NAME=VAR=VALUE ...]
#          unpacks .dev/alt.tar.xz (if built) and times the unpadded attention's forward and backward
#          alone (`dmove bench --lengths` at full fill: BERT-large heads, bf16, dropout 0.1
#          and 0, b=8 j=512 and b=96 j=128) for the default binary (.dev/bin/dmove, from
#          pack.sh), each variant, and the default binary again under each NAME=VAR=VALUE
#          (a run-time switch: e.g. mt2=DMOVE_CUDA_FLASH_MT=2), one after the other, and
#          prints the table
# FL_FWD_MINB, FL_DQ_MINB: the blocks an SM the forward and dQ kernels must fit at P = 64
# (their registers capped to fit); see flash.cu. Only flash.cu is rebuilt: a flag meant for
# another file needs that file touched too.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
case "${1:-}" in
build)
    shift
    [ $# -gt 0 ] || { echo "variants.sh build NAME=FLAGS ...: no variant named" >&2; exit 2; }
    tmp=$(mktemp -d) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    for v in "$@"; do
        name=${v%%=*} flags=${v#*=}
        case $name in '' | *[!A-Za-z0-9_-]*) echo "variants.sh: '$name': a name of letters, digits, _ and -" >&2; exit 2 ;; esac
        [ "$name" != "$v" ] || { echo "variants.sh: '$v': NAME=FLAGS" >&2; exit 2; }
        echo "== $name: NVCC_EXTRA='$flags'"
        touch "$root/src/cuda/flash.cu"
        make -C "$root" -j"$(nproc)" NVCC_EXTRA="$flags" build/dmove >"$tmp/make.log" 2>&1 ||
            { tail -20 "$tmp/make.log"; echo "variants.sh: $name did not build" >&2; exit 1; }
        cp "$root/build/dmove" "$tmp/dmove-$name" && strip "$tmp/dmove-$name" || exit 1
    done
    echo "== the default again"
    touch "$root/src/cuda/flash.cu"
    make -C "$root" -j"$(nproc)" build/dmove >"$tmp/make.log" 2>&1 || { tail -20 "$tmp/make.log"; exit 1; }
    mkdir -p "$root/.dev" && rm -f "$tmp/make.log" &&
        tar -cJf "$root/.dev/alt.tar.xz.tmp" -C "$tmp" . && mv "$root/.dev/alt.tar.xz.tmp" "$root/.dev/alt.tar.xz" || exit 1
    ls -l "$root/.dev/alt.tar.xz"
    ;;
run)
    alt=$root/.dev/alt
    mkdir -p "$alt" || exit 1
    [ ! -r "$root/.dev/alt.tar.xz" ] || tar -xJf "$root/.dev/alt.tar.xz" -C "$alt" || exit 1
    [ -x "$root/.dev/bin/dmove" ] || tar -xJf "$root/.dev/pack.tar.xz" -C "$root/.dev" || exit 1
    export LD_LIBRARY_PATH="$root/.dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    shift
    printf "%-12s %s\n" variant "forward / backward ms: b=8 j=512 p=0.1 | p=0 | b=96 j=128 p=0.1 | p=0"
    for bin in "$root/.dev/bin/dmove" "$alt"/dmove-* "$@"; do
        name=${bin##*/dmove-} envv=""
        [ "$bin" = "$root/.dev/bin/dmove" ] && name=default
        case $bin in
        /*) [ -x "$bin" ] || continue ;;
        *=*=*) name=${bin%%=*} envv=${bin#*=} bin=$root/.dev/bin/dmove ;;
        *) echo "variants.sh run: '$bin': NAME=VAR=VALUE" >&2; exit 2 ;;
        esac
        line=""
        for s in 8x512 96x128; do
            for p in 0.1 0; do
                b=${s%x*} j=${s#*x}
                # shellcheck disable=SC2086 # envv is one VAR=VALUE word or none
                out=$(env $envv timeout 60 "$bin" bench --device cuda --dtype bf16 --preset bert-large --batch "$b" --seq "$j" \
                    --dropout "$p" --lengths "uniform:$j-$j" --reps 10 --warmup 3 2>&1)
                f=$(echo "$out" | sed -n 's/^unpadded attention forward: \([0-9.]*\) ms.*/\1/p')
                w=$(echo "$out" | sed -n 's/^unpadded attention backward: \([0-9.]*\) ms.*/\1/p')
                line="$line  ${f:-?} / ${w:-?}"
            done
        done
        printf "%-12s%s\n" "$name" "$line"
    done
    ;;
*)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
