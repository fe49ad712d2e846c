/* genrt.cuh: what the kernels generated per fused group (src/cudagen/) are written against:
 * element conversions, 8-wide loads and stores, Philox dropout of a chunk, and sums and
 * maxima over a team of lanes. The generated text includes it; NVRTC compiles the two
 * for the GPU. For the tests, the host compiler builds them into the generated kernels'
 * host emulation, either a team of one lane that holds the whole row (fast), or, with
 * DMG_SIM, the device kernels themselves with every lane a thread of its own (pthreads):
 * the launch shape, teams, shuffles (a barrier per warp), 16-byte accesses and shared
 * memory as on the GPU, so a lane that misses a shuffle deadlocks and a wrong lane
 * mapping gives wrong numbers. Every piece is __host__ __device__. */
#ifndef DM_CUDA_GENRT_CUH
#define DM_CUDA_GENRT_CUH

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/philox.cuh"
#include "cuda/rowcore.cuh"

#define DMG_HD __host__ __device__ __forceinline__

/* The kernel's view of its launch: CUDA's, or the simulation's (below). */
#ifdef __CUDACC_RTC__
#define DMG_KERNEL(threads) extern "C" __global__ void __launch_bounds__(threads)
#define DMG_TID ((int)threadIdx.x)
#define DMG_NTHR ((int)blockDim.x)
#define DMG_BID ((int)blockIdx.x)
#define DMG_NBLK ((int)gridDim.x)
#define DMG_SMEM(name) extern __shared__ __align__(128) float name[]
#define DMG_SYNC() __syncthreads()
#elif defined(DMG_SIM)
#include <functional>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
/* One block at a time: its threads (the lanes) run concurrently; a block barrier between
 * blocks; per warp, a barrier pair around each exchange of a shuffle. */
struct dmg_simblock {
    pthread_barrier_t block, warp[32];
    float xchg[1024];
    float *smem;
    long long smem_n; /* floats, NaN again before each block */
};
static dmg_simblock *dmg_sim;
static thread_local int dmg_tid, dmg_nthr, dmg_bid, dmg_nblk;
#define DMG_KERNEL(threads) static void
#define DMG_TID dmg_tid
#define DMG_NTHR dmg_nthr
#define DMG_BID dmg_bid
#define DMG_NBLK dmg_nblk
#define DMG_SMEM(name) float *name = dmg_sim->smem
#define DMG_SYNC() pthread_barrier_wait(&dmg_sim->block)

static float dmg_shfl_xor(float v, int o) {
    const int w = dmg_tid / 32, l = dmg_tid % 32;
    dmg_sim->xchg[dmg_tid] = v;
    pthread_barrier_wait(&dmg_sim->warp[w]);
    const float r = dmg_sim->xchg[w * 32 + (l ^ o)];
    pthread_barrier_wait(&dmg_sim->warp[w]);
    return r;
}

/* A 16-byte access the GPU would fault on stops the test, saying where. */
static void dmg_sim_aligned(const void *p, const char *what) {
    if ((uintptr_t)p % 16 == 0) return;
    fprintf(stderr, "generated kernel, simulated lane %d of block %d: 16-byte %s at %p, not "
            "16-byte aligned\n", dmg_tid, dmg_bid, what, p);
    abort();
}

struct dmg_simarg {
    int tid, threads, blocks;
    const std::function<void()> *fn;
};

static void *dmg_sim_thread(void *a) {
    const dmg_simarg *x = (const dmg_simarg *)a;
    dmg_tid = x->tid;
    dmg_nthr = x->threads;
    dmg_nblk = x->blocks;
    for (int b = 0; b < x->blocks; b++) {
        dmg_bid = b;
        (*x->fn)();
        pthread_barrier_wait(&dmg_sim->block); /* the block is done before the next starts */
        if (b + 1 < x->blocks) { /* a new block's shared memory holds nothing it wrote */
            if (x->tid == 0)
                for (long long i = 0; i < dmg_sim->smem_n; i++) dmg_sim->smem[i] = __builtin_nanf("");
            pthread_barrier_wait(&dmg_sim->block);
        }
    }
    return 0;
}

/* fn (the kernel) on a grid of `blocks` blocks of `threads` threads, `smem` floats of
 * shared memory each (NaN at first: a read before a write shows). Aborts if a thread
 * cannot be made (a test, not the library, runs this). */
static void dmg_sim_run(int threads, int blocks, long long smem, const std::function<void()> &fn) {
    dmg_simblock *B = new dmg_simblock();
    dmg_sim = B;
    if (pthread_barrier_init(&B->block, 0, (unsigned)threads)) abort();
    for (int w = 0; w < threads / 32; w++)
        if (pthread_barrier_init(&B->warp[w], 0, 32)) abort();
    const size_t bytes = ((size_t)(smem > 0 ? smem : 1) * sizeof(float) + 127) / 128 * 128;
    B->smem = (float *)aligned_alloc(128, bytes);
    if (!B->smem) abort();
    B->smem_n = smem;
    for (long long i = 0; i < smem; i++) B->smem[i] = __builtin_nanf("");
    std::vector<pthread_t> th((size_t)threads);
    std::vector<dmg_simarg> arg((size_t)threads);
    for (int t = 0; t < threads; t++) {
        arg[(size_t)t] = dmg_simarg{t, threads, blocks, &fn};
        if (pthread_create(&th[(size_t)t], 0, dmg_sim_thread, &arg[(size_t)t])) abort();
    }
    for (int t = 0; t < threads; t++) pthread_join(th[(size_t)t], 0);
    for (int w = 0; w < threads / 32; w++) pthread_barrier_destroy(&B->warp[w]);
    pthread_barrier_destroy(&B->block);
    free(B->smem);
    delete B;
    dmg_sim = 0;
}
#endif

/* The kernels' global operands, by value (a kernel argument). */
enum { DMG_MAXP = 48 }; /* cuda_internal.h: DMC_GEN_MAXP */
typedef struct {
    void *p[DMG_MAXP];
} dmg_ptrs;

DMG_HD float dmg_inf(void) {
#ifdef __CUDA_ARCH__
    return __int_as_float(0x7f800000);
#else
    return INFINITY;
#endif
}
DMG_HD float dmg_f(float x) { return x; }
DMG_HD float dmg_f(__nv_bfloat16 x) { return __bfloat162float(x); }
DMG_HD float dmg_f(__half x) { return __half2float(x); }
template <typename T> DMG_HD T dmg_to(float v);
template <> DMG_HD float dmg_to<float>(float v) { return v; }
template <> DMG_HD __nv_bfloat16 dmg_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> DMG_HD __half dmg_to<__half>(float v) { return __float2half_rn(v); }

/* v[0..8) = p[0..n), zeros past n. V: p 16-byte aligned (one or two 16-byte loads for a
 * whole chunk). */
template <int V, typename T> DMG_HD void dmg_ld8(float v[8], const T *p, int n) {
#if defined(__CUDA_ARCH__) || defined(DMG_SIM)
    if (V && n == 8) {
#ifdef DMG_SIM
        dmg_sim_aligned(p, "load"); /* the device would fault */
#endif
        if (sizeof(T) == 4) {
            const float4 x = ((const float4 *)p)[0], y = ((const float4 *)p)[1];
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
            v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        } else {
            const uint4 u = *(const uint4 *)p;
            const T *h = (const T *)&u;
DMC_UNROLL
            for (int e = 0; e < 8; e++) v[e] = dmg_f(h[e]);
        }
        return;
    }
#endif
DMC_UNROLL
    for (int e = 0; e < 8; e++) v[e] = e < n ? dmg_f(p[e]) : 0.0f;
}

/* p[0..n) = v[0..n), rounded to T (nearest even). */
template <int V, typename T> DMG_HD void dmg_st8(T *p, const float v[8], int n) {
#if defined(__CUDA_ARCH__) || defined(DMG_SIM)
    if (V && n == 8) {
#ifdef DMG_SIM
        dmg_sim_aligned(p, "store");
#endif
        if (sizeof(T) == 4) {
            ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
            ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            uint4 u;
            T *h = (T *)&u;
DMC_UNROLL
            for (int e = 0; e < 8; e++) h[e] = dmg_to<T>(v[e]);
            *(uint4 *)p = u;
        }
        return;
    }
#endif
DMC_UNROLL
    for (int e = 0; e < 8; e++)
        if (e < n) p[e] = dmg_to<T>(v[e]);
}

/* v rounded to T, as a later read of what was stored would see it. */
template <typename T> DMG_HD void dmg_round8(float v[8]) {
DMC_UNROLL
    for (int e = 0; e < 8; e++) v[e] = dmg_f(dmg_to<T>(v[e]));
}

/* Inverted dropout of the chunk of element indices e0 .. e0 + n - 1: kept where the
 * element's 16-bit uniform (core/philox.h) is >= thr, scaled; as dropout_chunk in rows.cu. */
DMG_HD void dmg_drop8(float v[8], int n, unsigned long long seed, unsigned stream,
                      unsigned long long e0, unsigned thr, float scale) {
    unsigned long long q = e0 >> 3;
    uint4 w = dmc_philox_block(seed, stream, q);
DMC_UNROLL
    for (int e = 0; e < 8; e++) {
        if (e >= n) break;
        const unsigned long long idx = e0 + (unsigned long long)e;
        if ((idx >> 3) != q) {
            q = idx >> 3;
            w = dmc_philox_block(seed, stream, q);
        }
        v[e] = dmc_uniform_of(w, idx) >= thr ? v[e] * scale : 0.0f;
    }
}

/* Sum and maximum over the TEAM lanes that share a row (TEAM consecutive lanes of one
 * warp; every lane of the warp calls it, so the full mask is right). */
template <int TEAM> DMG_HD float dmg_sum(float v) {
#ifdef DMG_SIM
    for (int o = TEAM / 2; o > 0; o >>= 1) v += dmg_shfl_xor(v, o);
#endif
#ifdef __CUDA_ARCH__
DMC_UNROLL
    for (int o = TEAM / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
    return v;
}

template <int TEAM> DMG_HD float dmg_max(float v) {
#ifdef DMG_SIM
    for (int o = TEAM / 2; o > 0; o >>= 1) v = fmaxf(v, dmg_shfl_xor(v, o));
#endif
#ifdef __CUDA_ARCH__
DMC_UNROLL
    for (int o = TEAM / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
    return v;
}

/* Column accumulators (bias and LayerNorm parameter gradients): each team has nacc rows of
 * ACCW = NCH * TEAM * 8 floats in shared memory (the host: a buffer). Column
 * (c * TEAM + lt) * 8 + e, element e of the lane's chunk c, lives at DMG_AT(c, e): the
 * lanes of a team touch consecutive words (no bank conflicts). Uses TEAM and lt. */
#define DMG_AT(c, e) ((c) * (TEAM * 8) + (e) * TEAM + lt)

/* A block's partial column sums: part[a * colsp + col] = the sum over its `teams` teams'
 * accumulators (team t's at acc + t * tstride; in team order) of column col, 0 past cols;
 * i from i0 in steps. */
template <int TEAM, int NCH>
DMG_HD void dmg_acc_out(const float *acc, int teams, long long tstride, int nacc, long long cols,
                        long long colsp, float *part, int i0, int step) {
    const long long accw = (long long)NCH * TEAM * 8;
    for (long long i = i0; i < (long long)nacc * colsp; i += step) {
        const long long a = i / colsp, col = i % colsp;
        float s = 0.0f;
        if (col < cols) {
            const long long c = col / (TEAM * 8), rem = col % (TEAM * 8);
            const long long at = a * accw + c * (TEAM * 8) + (rem % 8) * TEAM + rem / 8;
            for (int t = 0; t < teams; t++) s += acc[(long long)t * tstride + at];
        }
        part[i] = s;
    }
}



/* A warp's barrier: its lanes' shared-memory writes are seen by all of them after it. */
#ifdef __CUDACC_RTC__
#define DMG_WSYNC() __syncwarp()
#elif defined(DMG_SIM)
#define DMG_WSYNC() pthread_barrier_wait(&dmg_sim->warp[dmg_tid / 32])
#else
#define DMG_WSYNC() ((void)0)
#endif

/* --- tensor-core tiles (the fused attention kernels, cudagen/attn.cu) ----------------- *
 * A warp's 16 x 16 x 16 product of 16-bit operands into fp32 accumulators. On the GPU,
 * nvcuda::wmma's fragments (operands in global or shared memory, 32-byte aligned, ld a
 * multiple of 8 elements); on the host every lane holds and computes the whole tile. The
 * fragments' layout on the GPU is opaque: the kernels touch them only through these calls.
 * CM: the operand is stored column-major (element (r, c) at p[c * ld + r]). */
#ifdef __CUDACC_RTC__
#include <mma.h>
template <int CM> struct dmg_lay { typedef nvcuda::wmma::row_major L; };
template <> struct dmg_lay<1> { typedef nvcuda::wmma::col_major L; };
template <typename T, int CM> struct dmg_fa {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, typename dmg_lay<CM>::L> f;
};
template <typename T, int CM> struct dmg_fb {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, typename dmg_lay<CM>::L> f;
};
struct dmg_fc {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f;
};
template <typename T, int CM> __device__ __forceinline__ void dmg_load_a(dmg_fa<T, CM> &a, const T *p, int ld) {
    nvcuda::wmma::load_matrix_sync(a.f, p, (unsigned)ld);
}
template <typename T, int CM> __device__ __forceinline__ void dmg_load_b(dmg_fb<T, CM> &b, const T *p, int ld) {
    nvcuda::wmma::load_matrix_sync(b.f, p, (unsigned)ld);
}
__device__ __forceinline__ void dmg_zero(dmg_fc &c) { nvcuda::wmma::fill_fragment(c.f, 0.0f); }
template <typename T, int CA, int CB>
__device__ __forceinline__ void dmg_mma(dmg_fc &c, const dmg_fa<T, CA> &a, const dmg_fb<T, CB> &b) {
    nvcuda::wmma::mma_sync(c.f, a.f, b.f, c.f);
}
__device__ __forceinline__ void dmg_scale(dmg_fc &c, float s) {
    for (int i = 0; i < c.f.num_elements; i++) c.f.x[i] *= s;
}
__device__ __forceinline__ void dmg_store_c(float *p, const dmg_fc &c, int ld) {
    nvcuda::wmma::store_matrix_sync(p, c.f, (unsigned)ld, nvcuda::wmma::mem_row_major);
}
#else
template <typename T, int CM> struct dmg_fa { float x[256]; }; /* x[r * 16 + k] */
template <typename T, int CM> struct dmg_fb { float x[256]; }; /* x[k * 16 + c] */
struct dmg_fc { float x[256]; };                             /* x[r * 16 + c] */
static inline void dmg_tile_aligned(const void *p, int ld, int esz) {
#ifdef DMG_SIM
    if ((uintptr_t)p % 32 == 0 && (ld * esz) % 16 == 0) return;
    fprintf(stderr, "fused attention kernel, simulated lane %d of block %d: tile at %p (ld %d) "
            "not 32-byte aligned as wmma needs\n", dmg_tid, dmg_bid, p, ld);
    abort();
#else
    (void)p, (void)ld, (void)esz;
#endif
}
template <typename T, int CM> static inline void dmg_load_a(dmg_fa<T, CM> &a, const T *p, int ld) {
    dmg_tile_aligned(p, ld, (int)sizeof(T));
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) a.x[r * 16 + k] = dmg_f(CM ? p[(long long)k * ld + r] : p[(long long)r * ld + k]);
}
template <typename T, int CM> static inline void dmg_load_b(dmg_fb<T, CM> &b, const T *p, int ld) {
    dmg_tile_aligned(p, ld, (int)sizeof(T));
    for (int k = 0; k < 16; k++)
        for (int c = 0; c < 16; c++) b.x[k * 16 + c] = dmg_f(CM ? p[(long long)c * ld + k] : p[(long long)k * ld + c]);
}
static inline void dmg_zero(dmg_fc &c) {
    for (int i = 0; i < 256; i++) c.x[i] = 0.0f;
}
template <typename T, int CA, int CB> static inline void dmg_mma(dmg_fc &c, const dmg_fa<T, CA> &a, const dmg_fb<T, CB> &b) {
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + n];
            c.x[r * 16 + n] = s;
        }
}
static inline void dmg_scale(dmg_fc &c, float s) {
    for (int i = 0; i < 256; i++) c.x[i] *= s;
}
static inline void dmg_store_c(float *p, const dmg_fc &c, int ld) {
    dmg_tile_aligned(p, ld, 4);
#ifdef DMG_SIM
    /* as with wmma, each lane of the warp stores its part of the tile (here every 32nd
     * element): a lane that reads the tile before the warp's barrier, or a next store
     * before every lane has read it, gets other values, and the results show it */
    for (int e = dmg_tid % 32; e < 256; e += 32) p[(long long)(e / 16) * ld + e % 16] = c.x[e];
#else
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) p[(long long)r * ld + n] = c.x[r * 16 + n];
#endif
}
#endif


#endif
