#!/bin/sh
# bench/gpu/pack.sh: builds dmove, tests/test_cuda, test_train and test_unpad on this machine and packs them, with
# the shared libraries a GPU machine of the device tool lacks, into .dev/ (git-ignored):
#   .dev/bin/dmove, .dev/bin/test_cuda, .dev/bin/test_train, test_unpad, test_model   (stripped)
#   .dev/lib/                            (OpenBLAS, cJSON, gfortran, gomp, libstdc++, ...)
#   .dev/COMMIT                          (the commit built, for the reports)
# The GPU machine has the CUDA toolkit and driver (cuBLAS, NVRTC, the headers NVRTC
# needs) but nothing can be installed there, and the device tool carries at most 64 MiB
# (.dev is about 50 MiB, most of it OpenBLAS). There, name .dev in the call's carry and run
#   LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove TEST_CUDA=.dev/bin/test_cuda \
#       sh bench/gpu/run.sh "$OUT/g"
# (SIZES=8x512 and SIZES=96x128 as two calls if one would pass the 10-minute limit), and
#   LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove TEST_TRAIN=.dev/bin/test_train \
#       sh bench/gpu/train.sh "$OUT/t"
# for `dmove train --device cuda`, and
#   LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove sh bench/gpu/sanitize.sh "$OUT/s"
# for compute-sanitizer over the kernels, and
#   LD_LIBRARY_PATH=$PWD/.dev/lib DMOVE=.dev/bin/dmove TEST_UNPAD=.dev/bin/test_unpad sh bench/gpu/unpad.sh
# for the unpadded layer (issue 25's point 3).
# PACK=xz: the same as one archive, .dev/pack.tar.xz (about 12 MB; .dev itself, with
# test_unpad, passes the tool's 64 MiB): there `tar -xJf .dev/pack.tar.xz -C .dev` first
# (bench/gpu/session.sh does).
# PACK=bert packs what bench/gpu/bert.sh runs instead (the whole BERT): bin/bert_step,
# bin/test_model, bin/test_model_ops, bin/test_cuda, lib/ and COMMIT as one archive,
# .dev/pack.tar.xz (about 7 MB: the four binaries and the libraries, 60 MB, would pass
# the 64 MiB the tool carries with the tree); there, with .dev carried, bert.sh unpacks
# it itself: sh bench/gpu/bert.sh "$OUT/b"
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.dev
if [ "${PACK:-}" = bert ]; then
    make -C "$root" -j"$(nproc)" build/tests/test_cuda build/tests/test_model build/tests/test_model_ops >/dev/null
    make -C "$root" -f Makefile -f bench/gpu/bench.mk build/bench/bert_step >/dev/null
    bins="$root/build/bench/bert_step $root/build/tests/test_model $root/build/tests/test_model_ops $root/build/tests/test_cuda"
else
    make -C "$root" -j"$(nproc)" all build/libdmove.so build/tests/test_cuda build/tests/test_train build/tests/test_unpad \
        build/tests/test_model >/dev/null
    bins="$root/build/dmove $root/build/tests/test_cuda $root/build/tests/test_train $root/build/tests/test_unpad
          $root/build/tests/test_model"
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
# shellcheck disable=SC2086 # bins is words (paths without spaces)
cp $bins "$out/bin/"
# the commit built, "+changes" if the tree differed from it (run.sh and train.sh print it)
c=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD -- src include cli tests Makefile 2>/dev/null || c="$c+changes"
echo "$c" >"$out/COMMIT"
strip "$out"/bin/*
# every library they load, but the C runtime and CUDA's own (the GPU machine's
# toolkit and driver must be the ones used) and NCCL's (over 200 MB; the GPU machine's
# PyTorch brings one, which common.sh's gpu_libs finds)
# shellcheck disable=SC2086
ldd $bins | awk '/=> \// {print $3}' | sort -u |
    while read -r lib; do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcu* | libnvrtc* | libnccl*) ;;
        *) cp -L "$lib" "$out/lib/" ;;
        esac
    done
# the CUDA build's shared library, for the Python package's tests there (DMOVE_LIB)
[ "${PACK:-}" = bert ] || { cp "$root/build/libdmove.so" "$out/lib/" && strip "$out/lib/libdmove.so"; }
du -sh "$out"
ls "$out/lib"
if [ "${PACK:-}" = bert ] || [ "${PACK:-}" = xz ]; then
    tar -cJf "$out/pack.tar.xz.tmp" -C "$out" bin lib COMMIT
    rm -rf "${out:?}/bin" "${out:?}/lib" "${out:?}/COMMIT"
    mv "$out/pack.tar.xz.tmp" "$out/pack.tar.xz"
    ls -l "$out/pack.tar.xz"
fi
