# bench/gpu/common.sh: sourced by run.sh and train.sh. gpu_setup TEST: unless DMOVE names a
# prebuilt dmove, builds dmove and tests/TEST here (make) and sets DMOVE and BUILT_TEST
# (else BUILT_TEST is empty); then points NVRTC (the generated kernels, compiled at run
# time against the toolkit's headers) at this machine's toolkit, where the binaries were
# built elsewhere; and sets COMMIT (unless given: pack.sh's record beside prebuilt binaries,
# else git's HEAD) and GPU (the
# board's name and driver, for the report). Needs OUT (for build.log) and root.
gpu_setup() {
    BUILT_TEST=
    if [ -z "${DMOVE:-}" ]; then
        echo "building dmove (make -C $root)" >&2
        make -C "$root" -j"$(nproc)" all "build/tests/$1" >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
        DMOVE=$root/build/dmove
        BUILT_TEST=$root/build/tests/$1
    fi
    if [ -z "${DMOVE_CUDA_INCLUDE:-}" ] && [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null 2>&1; then
        inc=$(cd "$(dirname "$(readlink -f "$(command -v nvcc)")")/../include" 2>/dev/null && pwd)
        [ -n "$inc" ] && [ -r "$inc/cuda_bf16.h" ] && export DMOVE_CUDA_INCLUDE="$inc"
    fi
    # prebuilt binaries: the commit pack.sh wrote beside them (the tree carried to a GPU
    # machine may hold an older .git than the one the binaries were built from)
    packed=$(dirname "$DMOVE")/../COMMIT
    [ -z "${COMMIT:-}" ] && [ -r "$packed" ] && COMMIT="$(cat "$packed") (pack.sh's build)"
    COMMIT=${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
    GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
}

# gpu_libs BINARY: where BINARY misses libnccl.so.2 (pack.sh leaves it out: over 200 MB),
# adds the one the GPU machine's PyTorch brings (the nvidia-nccl package) to LD_LIBRARY_PATH.
gpu_libs() {
    ldd "$1" 2>/dev/null | grep -q "libnccl.so.2 => not found" || return 0
    d=$(${PYTHON:-python3} -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)
    if [ -n "$d" ] && [ -r "$d/libnccl.so.2" ]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        echo "libnccl.so.2 is missing and no Python nvidia-nccl package has one: set LD_LIBRARY_PATH to a folder with it" >&2
    fi
}
