/* philox.cuh: Philox-4x32-10 on the device, bit-identical to src/core/philox.c, so that
 * a dropout mask is the same on the GPU as on the CPU (the definition is in
 * core/philox.h: key = seed halves, counter = (block index halves, stream, 0), word
 * m & 3 of block m >> 2 is word m; element n's uniform is half n & 1 of word n >> 1). CUDA C++: nvcc (device and host code), and NVRTC, which
 * compiles the generated kernels (src/cudagen/) with this text; the host versions serve
 * the generated kernels' host emulation. */
#ifndef DM_CUDA_PHILOX_CUH
#define DM_CUDA_PHILOX_CUH

#ifdef __CUDACC_RTC__
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <stdint.h>
#include <vector_types.h>
#include <vector_functions.h>
#endif

/* #pragma unroll for the device passes only (host compilers warn about it). */
#ifdef __CUDA_ARCH__
#define DMC_UNROLL _Pragma("unroll")
#define DMC_UNROLL4 _Pragma("unroll 4")
#else
#define DMC_UNROLL
#define DMC_UNROLL4
#endif

/* Random123's constants, as in philox.c. */
#define DMC_PHILOX_M0 0xD2511F53u
#define DMC_PHILOX_M1 0xCD9E8D57u
#define DMC_PHILOX_W0 0x9E3779B9u
#define DMC_PHILOX_W1 0xBB67AE85u

/* The high half of the 32x32-bit product (__umulhi on the device, as the CPU takes it
 * from a 64-bit multiply). */
__host__ __device__ __forceinline__ uint32_t dmc_umulhi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * (uint64_t)b) >> 32);
#endif
}

/* One round of a block: x = (x0, x1, x2, x3) under the round's key (k0, k1). */
__host__ __device__ __forceinline__ void dmc_philox_round(uint32_t &x0, uint32_t &x1, uint32_t &x2, uint32_t &x3,
                                                          uint32_t k0, uint32_t k1) {
    const uint32_t lo0 = DMC_PHILOX_M0 * x0, hi0 = dmc_umulhi(DMC_PHILOX_M0, x0);
    const uint32_t lo1 = DMC_PHILOX_M1 * x2, hi1 = dmc_umulhi(DMC_PHILOX_M1, x2);
    x0 = hi1 ^ x1 ^ k0;
    x2 = hi0 ^ x3 ^ k1;
    x1 = lo1;
    x3 = lo0;
}

/* One block: 10 rounds, the key bumped before every round but the first (as
 * dm_philox4x32_10). */
__host__ __device__ __forceinline__ uint4 dmc_philox4x32_10(uint32_t x0, uint32_t x1, uint32_t x2,
                                                   uint32_t x3, uint32_t k0, uint32_t k1) {
DMC_UNROLL
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += DMC_PHILOX_W0;
            k1 += DMC_PHILOX_W1;
        }
        dmc_philox_round(x0, x1, x2, x3, k0, k1);
    }
    return make_uint4(x0, x1, x2, x3);
}

/* The keys of a seed's ten rounds (rk[2r], rk[2r + 1]: the key plus r times the Weyl
 * constants), for a kernel that draws many blocks: passed as its parameters, every round's
 * xor takes its key as an operand, where dmc_philox4x32_10 adds it anew for each block. */
__host__ __device__ inline void dmc_philox_keys(uint64_t seed, uint32_t rk[20]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++, k0 += DMC_PHILOX_W0, k1 += DMC_PHILOX_W1) rk[2 * r] = k0, rk[2 * r + 1] = k1;
}
/* dmc_philox4x32_10 under those keys */
__host__ __device__ __forceinline__ uint4 dmc_philox_keyed(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3,
                                                           const uint32_t rk[20]) {
DMC_UNROLL
    for (int r = 0; r < 10; r++) dmc_philox_round(x0, x1, x2, x3, rk[2 * r], rk[2 * r + 1]);
    return make_uint4(x0, x1, x2, x3);
}

/* Block `blk` of stream `stream` under `seed`: the 4 words of element indices 4*blk ..
 * 4*blk + 3. */
__host__ __device__ __forceinline__ uint4 dmc_philox_block(uint64_t seed, uint32_t stream, uint64_t blk) {
    return dmc_philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), stream, 0u, (uint32_t)seed,
                             (uint32_t)(seed >> 32));
}

__host__ __device__ __forceinline__ uint32_t dmc_uint4_word(uint4 w, int j) {
    return j == 0 ? w.x : j == 1 ? w.y : j == 2 ? w.z : w.w;
}

/* The dropout's 16-bit uniform of element index e (core/philox.h): half e & 1 of word e >> 1,
 * which block e >> 3 (w) holds as its word (e >> 1) & 3 */
__host__ __device__ __forceinline__ uint32_t dmc_uniform_of(uint4 w, uint64_t e) {
    return (dmc_uint4_word(w, (int)((e >> 1) & 3)) >> (16 * (int)(e & 1))) & 0xFFFFu;
}
__host__ __device__ __forceinline__ uint32_t dmc_dropout_uniform(uint64_t seed, uint32_t stream, uint64_t e) {
    return dmc_uniform_of(dmc_philox_block(seed, stream, e >> 3), e);
}

#endif
