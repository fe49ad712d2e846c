/* flash.cu: ATTN and ATTN_BWD (varlen.cu's op) as flash-style kernels on the tensor cores,
 * for bf16 and fp16 storage and head widths 64 and 128 (issue 25): the scores never go to
 * memory. Per (sequence, head):
 *   forward, a block per 64 queries (4 warps of 16): the queries' fragments stay in
 *     registers; per tile of 64 keys (K and V through shared memory) S = alpha Q K^T by
 *     mma.sync m16n8k16, the padding (keys past the sequence) and causal masks, or the
 *     attention mask's terms (keymask: the padded layer's attention_mask, whole
 *     sequences), an online softmax (running maximum and sum per row), the dropout (the
 *     CPU's 16-bit uniforms of the padded element index (s, h, j, k), drawn as bits for the
 *     tile before its products, the lanes sharing each Philox block: fl_keep_rows and
 *     fl_keep_cols), and O += dropped(P) V
 *     with P straight from the accumulators as the next MMA's operand. Writes the context
 *     and, per query row, the maximum of its scores and the log of their sum past it (two
 *     values, not their sum: a row whose keys are all masked has every score -FLT_MAX,
 *     where m + log(sum) rounds back to m), where the other path keeps the probabilities:
 *     the op's probs tensor (b h j k, dt) holds the 2 B H J fp32 values at its start
 *     instead (room at j >= 4), and only this file's backward reads them (dmc_flash_ok
 *     decides for both passes alike).
 *   backward: D = rowsum(dctx * ctx) per query row first; then a block per 64 keys (a
 *     warp per 16) walks the query tiles: P^T = exp(alpha K Q^T - m - log sum) again, dV +=
 *     dropped(P)^T dctx, dP^T = V dctx^T, dS^T = P^T (dropout_bwd(dP^T) - D), dK += alpha
 *     dS^T Q, in registers; and a block per 64 queries walks the key tiles as the forward
 *     does, computing P and dS once more, dQ += alpha dS K in registers. Two GEMMs more than
 *     one pass, but no partial dQ per key tile through memory (ceil(j/64) x b j h p fp32
 *     written and read: at j = 512 more traffic than the products' own), no atomics, and
 *     the same bits on every run.
 *   Tiles arrive by asynchronous copies (cp.async, sm_80 and later) into two buffers: the
 *     next tile's while this one's is read, one barrier a tile.
 * The probabilities enter the MMAs rounded to the storage type, as the other path rounds
 * the probabilities it stores; sums are fp32. dmc_flash_run's host emulation runs these
 * kernels themselves lane by lane: every lane a thread (pthreads), __syncthreads a block
 * barrier, shuffles, each ldmatrix (shared-memory tiles into fragments, x4, plain or
 * transposed) and each mma.sync an exchange through a warp barrier, with the fragments
 * assembled by the PTX ISA's layouts (m16n8k16 A: rows g and g + 8, columns 2t, 2t + 1,
 * 2t + 8, 2t + 9; B: rows 2t, 2t + 1, 2t + 8, 2t + 9 of column g; C: rows g and g + 8,
 * columns 2t and 2t + 1; ldmatrix: lanes 8m .. 8m + 7 address matrix m's rows, lane (g, t)
 * receives its (g, 2t..2t+1), transposed (2t..2t+1, g); g = lane / 4, t = lane % 4), so a
 * wrong lane mapping gives wrong numbers and a lane that misses a barrier hangs the test.
 * The asynchronous copies land at once there: the GPU's own races are compute-sanitizer's
 * (bench/gpu/sanitize.sh). */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cuda/philox.cuh"
#include "cuda/rowmath.cuh"

#ifndef __CUDA_ARCH__
#include <pthread.h>

#include <functional>
#include <vector>
#endif

/* the device compiler unrolls the loops that index register arrays (else they go to local
 * memory); the host's has no such pragma */
#ifdef __CUDA_ARCH__
#define FL_UNROLL _Pragma("unroll")
#define FL_UNROLL2 _Pragma("unroll 2")
#else
#define FL_UNROLL
#define FL_UNROLL2
#endif

enum { FL_WARPS = 4, FL_THREADS = 32 * FL_WARPS, FL_TILE = 64 /* queries or keys a block */ };

/* ---- the lanes' view: CUDA's, or the emulation's -------------------------------------- */

#ifndef __CUDA_ARCH__
struct fl_sim {
    pthread_barrier_t block, warp[FL_WARPS];
    uint32_t xa[FL_THREADS][4], xb[FL_THREADS][2];
    uint32_t xu[FL_THREADS];
    const void *xp[FL_THREADS]; /* ldmatrix: the lanes' row addresses */
};
static fl_sim *g_fl_sim; /* the running emulation (one at a time: g_fl_lock) */
static pthread_mutex_t g_fl_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_local int fl_htid;
#endif

static __host__ __device__ __forceinline__ void fl_sync() {
#ifdef __CUDA_ARCH__
    __syncthreads();
#else
    pthread_barrier_wait(&g_fl_sim->block);
#endif
}

/* lane ^ o's v (a float or a uint32_t: 32 bits, exchanged as they are) */
template <typename X> static __host__ __device__ __forceinline__ X fl_shfl_xor(X v, int o) {
#ifdef __CUDA_ARCH__
    return __shfl_xor_sync(0xffffffffu, v, o);
#else
    static_assert(sizeof(X) == 4, "32-bit lanes");
    fl_sim *S = g_fl_sim;
    const int w = fl_htid / 32;
    memcpy(&S->xu[fl_htid], &v, 4);
    pthread_barrier_wait(&S->warp[w]);
    X r;
    memcpy(&r, &S->xu[w * 32 + ((fl_htid % 32) ^ o)], 4);
    pthread_barrier_wait(&S->warp[w]);
    return r;
#endif
}

/* the four lanes of a row's quad (lanes 4g .. 4g + 3) */
static __host__ __device__ __forceinline__ float fl_quad_max(float v) {
    v = fmaxf(v, fl_shfl_xor(v, 1));
    return fmaxf(v, fl_shfl_xor(v, 2));
}
static __host__ __device__ __forceinline__ float fl_quad_sum(float v) {
    v += fl_shfl_xor(v, 1);
    return v + fl_shfl_xor(v, 2);
}

/* e^x as the SFU's 2^(x log2 e) (ex2.approx.ftz: about 2 ulp, results under 2^-126 flushed
 * to 0; e^-inf = 0): three instructions where expf takes about eight. The emulation's,
 * exp2f. */
static __host__ __device__ __forceinline__ float fl_exp(float x) {
    x *= 1.4426950408889634f;
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

/* Two stored elements as the 32-bit word an MMA operand register holds (lo: the lower
 * column or row); two fp32 values rounded to type T, as such a word. */
template <typename T> static __host__ __device__ __forceinline__ uint32_t fl_join(const T *lo, const T *hi) {
    unsigned short ua, ub;
    memcpy(&ua, lo, 2);
    memcpy(&ub, hi, 2);
    return (uint32_t)ua | (uint32_t)ub << 16;
}
static __host__ __device__ __forceinline__ void fl_round(float x, __nv_bfloat16 *o) { *o = __float2bfloat16_rn(x); }
static __host__ __device__ __forceinline__ void fl_round(float x, __half *o) { *o = __float2half_rn(x); }
template <typename T> static __host__ __device__ __forceinline__ uint32_t fl_pack(float lo, float hi) {
    T a, b;
    fl_round(lo, &a);
    fl_round(hi, &b);
    return fl_join<T>(&a, &b);
}

template <typename T> struct fl_is_bf16 { enum { value = 0 }; };
template <> struct fl_is_bf16<__nv_bfloat16> { enum { value = 1 }; };

#ifndef __CUDA_ARCH__
static float fl_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static float fl_to_float(__half x) { return __half2float(x); }
template <typename T> static float fl_half_of(uint32_t w, int hi) {
    __nv_bfloat16_raw rb;
    __half_raw rh;
    rb.x = rh.x = (unsigned short)(hi ? w >> 16 : w & 0xFFFFu);
    return fl_is_bf16<T>::value ? fl_to_float(__nv_bfloat16(rb)) : fl_to_float(__half(rh));
}
#endif

/* c += A B for one warp: A 16 x 16 (a[4]), B 16 x 8 (b[2]), C 16 x 8 (c[4]), fp32 sums */
template <typename T>
static __host__ __device__ __forceinline__ void fl_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef __CUDA_ARCH__
#if __CUDA_ARCH__ >= 800
    if (fl_is_bf16<T>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap(); /* not built: the executor refuses devices below compute capability 8.0 */
#endif
#else
    fl_sim *S = g_fl_sim;
    const int w = fl_htid / 32, lane = fl_htid % 32, g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; q++) S->xa[fl_htid][q] = a[q];
    for (int q = 0; q < 2; q++) S->xb[fl_htid][q] = b[q];
    pthread_barrier_wait(&S->warp[w]);
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 16; k++) {
            const int la = w * 32 + (r % 8) * 4 + (k % 8) / 2, ra = (r >= 8) + 2 * (k >= 8);
            const int lb = w * 32 + n * 4 + (k % 8) / 2, rb = k >= 8;
            acc += fl_half_of<T>(S->xa[la][ra], k % 2) * fl_half_of<T>(S->xb[lb][rb], k % 2);
        }
        c[e] = acc;
    }
    pthread_barrier_wait(&S->warp[w]);
#endif
}

#ifndef __CUDA_ARCH__
/* fn on a grid of gx x gy x gz blocks of FL_THREADS lanes, one block at a time, each lane a
 * thread; fn(tid, bx, by, bz, smem). Shared memory is NaN at each block's start. */
struct fl_simarg {
    int tid, gx, gy, gz;
    float *smem;
    long long smem_n;
    const std::function<void(int, int, int, int, char *)> *fn;
};

static void *fl_sim_thread(void *p) {
    const fl_simarg *x = (const fl_simarg *)p;
    fl_htid = x->tid;
    for (int bz = 0; bz < x->gz; bz++)
        for (int by = 0; by < x->gy; by++)
            for (int bx = 0; bx < x->gx; bx++) {
                if (x->tid == 0)
                    for (long long i = 0; i < x->smem_n; i++) x->smem[i] = __builtin_nanf("");
                pthread_barrier_wait(&g_fl_sim->block);
                (*x->fn)(x->tid, bx, by, bz, (char *)x->smem);
                pthread_barrier_wait(&g_fl_sim->block);
            }
    return 0;
}

static dm_status fl_sim_run(int gx, int gy, int gz, size_t smem_bytes,
                            const std::function<void(int, int, int, int, char *)> &fn) {
    dm_status st = DM_OK;
    pthread_mutex_lock(&g_fl_lock);
    fl_sim *S = new fl_sim();
    const long long nf = (long long)((smem_bytes + 3) / 4);
    float *smem = (float *)aligned_alloc(128, (size_t)(nf + 32) / 32 * 128);
    int ok = smem && !pthread_barrier_init(&S->block, 0, FL_THREADS);
    for (int w = 0; ok && w < FL_WARPS; w++) ok = !pthread_barrier_init(&S->warp[w], 0, 32);
    g_fl_sim = S;
    std::vector<pthread_t> th(FL_THREADS);
    std::vector<fl_simarg> arg(FL_THREADS);
    int made = 0;
    for (; ok && made < FL_THREADS; made++) {
        arg[(size_t)made] = fl_simarg{made, gx, gy, gz, smem, nf, &fn};
        if (pthread_create(&th[(size_t)made], 0, fl_sim_thread, &arg[(size_t)made])) break;
    }
    if (ok && made < FL_THREADS) { /* the threads made wait at the first barrier forever: a test-only path */
        fprintf(stderr, "flash emulation: cannot start %d threads\n", FL_THREADS);
        abort();
    }
    for (int t = 0; ok && t < FL_THREADS; t++) pthread_join(th[(size_t)t], 0);
    if (!ok) st = dm_fail(DM_ERR_OOM, "flash attention emulation: out of memory or barriers");
    free(smem);
    delete S;
    g_fl_sim = 0;
    pthread_mutex_unlock(&g_fl_lock);
    return st;
}
#endif

/* ---- the kernels' pieces ---------------------------------------------------------------- */

struct fl_args {
    dmc_varlen v;
    uint32_t rk[20]; /* the dropout seed's round keys (dmc_philox_keys), as parameters */
    int vec16; /* every token-row operand 16-byte aligned with a row stride of 8 elements */
    int mt;    /* the forward's 16-row tiles a warp at P = 64 (1 or 2: DMOVE_CUDA_FLASH_MT) */
};

/* 16 bytes from global memory at src (when ok, else zeros) to shared memory at dst: on
 * sm_80 and later an asynchronous copy (cp.async, bypassing L1, zero-filled when !ok:
 * nothing read), which lands by fl_cp_wait; else, and in the emulation, at once. */
static __host__ __device__ __forceinline__ void fl_cp16(void *dst, const void *src, int ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
#else
    uint4 x = make_uint4(0, 0, 0, 0);
    if (ok) x = *(const uint4 *)src;
    *(uint4 *)dst = x;
#endif
}
/* the copies this lane issued since the last commit, as one group */
static __host__ __device__ __forceinline__ void fl_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* waits until at most N of this lane's committed groups are in flight (the older ones have
 * landed); a barrier after it makes every lane's visible */
template <int N> static __host__ __device__ __forceinline__ void fl_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* rows [r0, r0 + 64) of a token-row operand (head columns at src, row stride ld) into a
 * shared tile of row stride P + 8; rows at or past n zero. vec16: by fl_cp16 (the caller
 * commits, waits and syncs); else by 4-byte loads and stores, landed at once. */
template <typename T, int P>
static __host__ __device__ __forceinline__ void fl_load_tile(T *dst, const T *src, int64_t ld, int r0, int n, int tid,
                                                             int vec16) {
    const int LDS = P + 8;
    if (vec16) {
        for (int c = tid; c < FL_TILE * (P / 8); c += FL_THREADS) {
            const int r = c / (P / 8), col = (c % (P / 8)) * 8, ok = r0 + r < n;
            fl_cp16(dst + r * LDS + col, src + (ok ? (int64_t)(r0 + r) * ld + col : 0), ok);
        }
        return;
    }
    for (int c = tid; c < FL_TILE * (P / 2); c += FL_THREADS) {
        const int r = c / (P / 2), col = (c % (P / 2)) * 2;
        uint32_t x = 0;
        if (r0 + r < n) x = *(const uint32_t *)(src + (int64_t)(r0 + r) * ld + col);
        *(uint32_t *)(dst + r * LDS + col) = x;
    }
}

/* Four 8x8 matrices of 16-bit elements from shared memory, the 8 lanes 8m .. 8m + 7 giving
 * the rows of matrix m (16 contiguous bytes each, 16-byte aligned; p: this lane's row):
 * r[m] = its elements (g, 2t) and (g, 2t + 1), or with TRANS (2t, g) and (2t + 1, g). One
 * ldmatrix on the device; the emulation exchanges the lanes' row addresses through a warp
 * barrier and reads the elements each lane would receive, so a wrong row mapping gives
 * wrong numbers there too. */
template <int TRANS> static __host__ __device__ __forceinline__ void fl_ldsm4(uint32_t r[4], const void *p) {
#ifdef __CUDA_ARCH__
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
#else
    fl_sim *S = g_fl_sim;
    const int w = fl_htid / 32, lane = fl_htid % 32, g = lane / 4, t = lane % 4;
    S->xp[fl_htid] = p;
    pthread_barrier_wait(&S->warp[w]);
    for (int m = 0; m < 4; m++) {
        unsigned short e[2];
        for (int q = 0; q < 2; q++) {
            const int row = TRANS ? 2 * t + q : g, col = TRANS ? g : 2 * t + q;
            memcpy(&e[q], (const char *)S->xp[w * 32 + 8 * m + row] + 2 * col, 2);
        }
        r[m] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    pthread_barrier_wait(&S->warp[w]);
#endif
}

/* the A fragment of 16 rows (r ..) x 16 columns (c ..) of a shared tile X: the matrices at
 * (r, c), (r + 8, c), (r, c + 8), (r + 8, c + 8) */
template <typename T, int LDS>
static __host__ __device__ __forceinline__ void fl_frag_a(uint32_t a[4], const T *s, int r, int c, int g, int t) {
    const int l = 4 * g + t, m = l >> 3, i = l & 7;
    fl_ldsm4<0>(a, s + (r + i + (m & 1) * 8) * LDS + c + (m >> 1) * 8);
}
/* the B fragments of B = X^T (X's row n is B's column n) for B's columns n0 .. n0 + 7 (b[0],
 * b[1]) and n0 + 8 .. n0 + 15 (b[2], b[3]), B's rows (X's columns) c .. c + 15: the matrices
 * at (n0, c), (n0, c + 8), (n0 + 8, c), (n0 + 8, c + 8) */
template <typename T, int LDS>
static __host__ __device__ __forceinline__ void fl_frag_bt2(uint32_t b[4], const T *s, int n0, int c, int g, int t) {
    const int l = 4 * g + t, m = l >> 3, i = l & 7;
    fl_ldsm4<0>(b, s + (n0 + i + (m >> 1) * 8) * LDS + c + (m & 1) * 8);
}
/* the B fragments of B = X for B's rows k0 .. k0 + 15 and columns n0 .. n0 + 7 (b[0], b[1])
 * and n0 + 8 .. n0 + 15 (b[2], b[3]): the matrices at (k0, n0), (k0 + 8, n0), (k0, n0 + 8),
 * (k0 + 8, n0 + 8), transposed */
template <typename T, int LDS>
static __host__ __device__ __forceinline__ void fl_frag_b2(uint32_t b[4], const T *s, int k0, int n0, int g, int t) {
    const int l = 4 * g + t, m = l >> 3, i = l & 7;
    fl_ldsm4<1>(b, s + (k0 + i + (m & 1) * 8) * LDS + n0 + (m >> 1) * 8);
}
/* accumulators of two 8-column tiles (16 columns) as the A fragment of the next MMA */
template <typename T>
static __host__ __device__ __forceinline__ void fl_c_to_a(uint32_t a[4], const float *c0, const float *c1) {
    a[0] = fl_pack<T>(c0[0], c0[1]);
    a[1] = fl_pack<T>(c0[2], c0[3]);
    a[2] = fl_pack<T>(c1[0], c1[1]);
    a[3] = fl_pack<T>(c1[2], c1[3]);
}

/* keymask: the term the attention mask adds to key k's scores in sequence s (MASK_ADD's),
 * 0 past the sequence */
static __host__ __device__ __forceinline__ float fl_mask_term(const dmc_varlen *v, int s, int k, int L) {
    return k < L ? dmc_mask_term(v, s, k) : 0.0f;
}

/* Philox block blk of the dropout's stream (dmc_philox_block's, under the round keys rk) */
static __host__ __device__ __forceinline__ uint4 fl_block(const dmc_varlen *v, const uint32_t *rk, uint64_t blk) {
    return dmc_philox_keyed((uint32_t)blk, (uint32_t)(blk >> 32), v->stream, 0u, rk);
}
/* element e's 16-bit uniform (core/philox.h: half e & 1 of word e >> 1, block e >> 3) */
static __host__ __device__ __forceinline__ uint32_t fl_uniform(const dmc_varlen *v, const uint32_t *rk, uint64_t e) {
    return dmc_uniform_of(fl_block(v, rk, e >> 3), e);
}
/* 1 where a word's halves (lo: bit 0, hi: bit 1) are kept (>= thr) */
static __host__ __device__ __forceinline__ uint32_t fl_kept2(uint32_t w, uint32_t thr) {
    return (uint32_t)((w & 0xFFFFu) >= thr) | (uint32_t)((w >> 16) >= thr) << 1;
}

/* A 4 x 4 transpose across four lanes, by two swaps: the lane at j (bit 0 its lane id's bit
 * o1, bit 1 its bit o2; the others' bits alike) holds row j of M (b = M[j][0 .. 3]) and gets
 * column j, in the order of j ^ s: out[d] = M[j ^ d][j] (fl_perm puts what is computed from
 * them in the order of s). Every lane of the warp calls it (shuffles). */
static __host__ __device__ __forceinline__ void fl_transpose4(uint4 b, int j, int o1, int o2, uint32_t out[4]) {
    const int j0 = j & 1, j1 = j >> 1;
    /* swap 1 (lane j ^ 1): keep the words y with y & 1 == j & 1, send the others */
    const uint32_t a0 = j0 ? b.y : b.x, a1 = j0 ? b.w : b.z; /* M[j][j0], M[j][j0 + 2] */
    const uint32_t r0 = fl_shfl_xor(j0 ? b.x : b.y, o1), r1 = fl_shfl_xor(j0 ? b.z : b.w, o1);
    /* now M[j ^ 1][j0] (r0), M[j ^ 1][j0 + 2] (r1); swap 2 (lane j ^ 2): keep y == j */
    out[0] = j1 ? a1 : a0, out[1] = j1 ? r1 : r0;
    out[2] = fl_shfl_xor(j1 ? a0 : a1, o2), out[3] = fl_shfl_xor(j1 ? r0 : r1, o2);
}
/* v's groups of W bits, 4 to a nibble's or byte's width, from the order d to the order
 * s = j ^ d (each group d moves to j ^ d): W = 2 a byte's groups, W = 1 each nibble's */
template <int W> static __host__ __device__ __forceinline__ uint32_t fl_perm(uint32_t v, int j) {
    const uint32_t m1 = W == 2 ? 0x33u : 0x55u, m2 = W == 2 ? 0x0Fu : 0x33u;
    if (j & 1) v = (v & m1) << W | (v >> W & m1);
    if (j & 2) v = (v & m2) << (2 * W) | (v >> (2 * W) & m2);
    return v;
}

/* Which of a lane's 32 elements of a 64-column tile the dropout keeps, as bits (n * 4 + e:
 * 8-column block n's c[e]: rows r0, r1 = r0 + 8 (e >> 1), columns 2t, 2t + 1 (e & 1)), all
 * kept without dropout; er0, er1: the element indices of (r0, the tile's first column) and
 * (r1, ...). Computed before the tile's products (while fewer registers are live).
 * Where the sequence's J is a multiple of 8, each row's 8 columns of a block are one Philox
 * block, whose word t holds columns 2t and 2t + 1: the quad's lanes compute the 4 blocks of
 * two column blocks' rows (one a lane) and a 4 x 4 transpose hands lane t word t of each.
 * Else each lane draws its own. Every lane of the warp calls it (shuffles). */
static __host__ __device__ __forceinline__ uint32_t fl_keep_rows(const dmc_varlen *v, const uint32_t *rk, uint64_t er0,
                                                                 uint64_t er1, int t) {
    if (!v->drop) return 0xFFFFFFFFu;
    const uint32_t thr = v->thr;
    uint32_t bits = 0;
    if (v->J % 8 == 0) {
        FL_UNROLL2 /* two pairs' Philox chains at a time: all 4 at once cost registers the products need */
        for (int i = 0; i < 4; i++) { /* column blocks 2i and 2i + 1; lane t's: row t & 1 of block 2i + (t >> 1) */
            uint32_t w[4]; /* w[d]: word t of lane t ^ d's block */
            fl_transpose4(fl_block(v, rk, (((t & 1) ? er1 : er0) + (uint64_t)(16 * i + 8 * (t >> 1))) >> 3), t, 1, 2, w);
            const uint32_t byte = fl_perm<2>(fl_kept2(w[0], thr) | fl_kept2(w[1], thr) << 2 | fl_kept2(w[2], thr) << 4 |
                                                 fl_kept2(w[3], thr) << 6,
                                             t);
            bits = bits >> 8 | byte << 24; /* after the 4 pairs, pair i's at bits 8i .. 8i + 7 */
        }
        return bits;
    }
    FL_UNROLL2
    for (int n = 0; n < 8; n++) {
        uint32_t nib = 0;
        for (int r = 0; r < 2; r++) { /* the row's two columns: one block, or two across its end */
            const uint64_t e = (r ? er1 : er0) + (uint64_t)(8 * n + 2 * t);
            const uint4 b = fl_block(v, rk, e >> 3);
            const uint32_t u1 = ((e + 1) & 7) ? dmc_uniform_of(b, e + 1) : fl_uniform(v, rk, e + 1);
            nib |= ((uint32_t)(dmc_uniform_of(b, e) >= thr) | (uint32_t)(u1 >= thr) << 1) << (2 * r);
        }
        bits = bits >> 4 | nib << 28;
    }
    return bits;
}

/* The same for the dK dV block's transposed tile: rows keys key0 = kb + g, key1 = key0 + 8
 * (c[x]: key x >> 1 ? key1 : key0), columns queries c, c + 1 (x & 1), c = q0 + 8n + 2t;
 * eq0: the element index of (q0 + 2t, kb). With J a multiple of 8 (kb is of 16), the keys kb
 * .. kb + 7 of a query are one Philox block, key kb + g in half g & 1 of its word g >> 1: the
 * lanes g = 2i, 2i + 1 (the same t) both need word i of 4 blocks a column block (queries c
 * and c + 1, keys kb.. and kb + 8..). Lane g computes block i of column block 2m + (g & 1),
 * a 4 x 4 transpose among the lane pairs hands each word i of its column block's 4 (swaps
 * across lane id bits 8 and 16), and a swap with lane g ^ 1 (lane id bit 4) of the halves
 * each needs of the other's: one Philox a lane for two column blocks. Else each lane draws
 * its own. Every lane of the warp calls it (shuffles). */
static __host__ __device__ __forceinline__ uint32_t fl_keep_cols(const dmc_varlen *v, const uint32_t *rk, uint64_t eq0,
                                                                 int g) {
    if (!v->drop) return 0xFFFFFFFFu;
    const uint32_t thr = v->thr;
    const uint64_t J = (uint64_t)v->J;
    uint32_t bits = 0;
    if (J % 8 == 0) {
        const int i = g >> 1, p = g & 1;
        FL_UNROLL2
        for (int m = 0; m < 4; m++) { /* column blocks 2m, 2m + 1 */
            /* block i (queries c + (i & 1), keys kb + 8 (i >> 1) ..) of column block 2m + p */
            const uint64_t e = eq0 + (uint64_t)(16 * m + 8 * p + (i & 1)) * J + (uint64_t)(8 * (i >> 1));
            uint32_t w[4];
            fl_transpose4(fl_block(v, rk, e >> 3), i, 8, 16, w); /* w[d]: word i of block i ^ d */
            /* the partner's halves (1 - p) of these, for its column block; its of mine back
             * (in the same order: its i is mine) */
            const uint32_t sh = p ? 0u : 16u;
            const uint32_t o0 = fl_shfl_xor((w[0] >> sh & 0xFFFFu) | (w[1] >> sh) << 16, 4),
                           o1 = fl_shfl_xor((w[2] >> sh & 0xFFFFu) | (w[3] >> sh) << 16, 4);
            uint32_t mine = 0, other = fl_kept2(o0, thr) | fl_kept2(o1, thr) << 2;
            for (int d = 0; d < 4; d++) mine |= (uint32_t)(((w[d] >> (16 * p)) & 0xFFFFu) >= thr) << d;
            const uint32_t byte = fl_perm<1>(p ? other | mine << 4 : mine | other << 4, i);
            bits = bits >> 8 | byte << 24;
        }
        return bits;
    }
    FL_UNROLL2
    for (int n = 0; n < 8; n++) {
        uint32_t nib = 0;
        for (int x = 0; x < 4; x++) {
            const uint64_t e = eq0 + (uint64_t)(8 * n + (x & 1)) * J + (uint64_t)(g + 8 * (x >> 1));
            nib |= (uint32_t)(fl_uniform(v, rk, e) >= thr) << x;
        }
        bits = bits >> 4 | nib << 28;
    }
    return bits;
}

/* A 16-row tile's scores against a 64-key tile (first key k0, a lane's c[e]: rows r0 + g
 * (+ 8), keys k0 + 8n + 2t (+ 1)) as the softmax's terms: alpha S, plus the attention mask's
 * terms (keymask: the tile's, in shared memory), -inf for keys past L and, causal, keys past
 * the row. Only a tile that reaches past L or across the diagonal tests each element (the
 * branch is the warp's: r0 its first row); the others, almost all at j >= 128, skip the
 * tests. Rows at or past L need none: their queries are zeros, so their terms are finite,
 * and nothing of theirs is kept. */
static __host__ __device__ __forceinline__ void fl_logits(float sc[8][4], const float *bias, int keymask,
                                                          float alpha, int k0, int r0, int L, int causal, int g,
                                                          int t) {
    if (keymask) {
        FL_UNROLL
        for (int n = 0; n < 8; n++) {
            const float2 bb = *(const float2 *)(bias + n * 8 + 2 * t);
            FL_UNROLL
            for (int e = 0; e < 4; e++) sc[n][e] = sc[n][e] * alpha + (e & 1 ? bb.y : bb.x);
        }
    } else {
        FL_UNROLL
        for (int n = 0; n < 8; n++)
            FL_UNROLL
            for (int e = 0; e < 4; e++) sc[n][e] *= alpha;
    }
    if (k0 + FL_TILE > L || (causal && k0 + FL_TILE - 1 > r0)) {
        FL_UNROLL
        for (int n = 0; n < 8; n++)
            FL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int row = r0 + g + (e >= 2 ? 8 : 0), col = k0 + n * 8 + 2 * t + (e & 1);
                if (col >= L || (causal && col > row)) sc[n][e] = -INFINITY;
            }
    }
}

/* ---- forward ---------------------------------------------------------------------------- */

/* Shared memory of a block that walks the keys (forward, dQ): two buffers of a K and a V
 * tile (row stride P + 8) and of the tile's mask terms, the next tile's loading (by
 * asynchronous copies) while this one's is read. */
template <typename T, int P> struct fl_kv_smem { /* by arithmetic: no array a register cannot hold */
    enum { TILE = FL_TILE * (P + 8) };
    char *base;
    __host__ __device__ T *k(int b) const { return (T *)base + 2 * TILE * b; }
    __host__ __device__ T *v(int b) const { return (T *)base + 2 * TILE * b + TILE; }
    __host__ __device__ float *bias(int b) const { return (float *)((T *)base + 4 * TILE) + FL_TILE * b; }
};

/* key tile k0's K and V rows (and keymask's terms) into buffer b, as one group of copies */
template <typename T, int P>
static __host__ __device__ __forceinline__ void fl_load_kv(const fl_args &A, const fl_kv_smem<T, P> &S, int b,
                                                           const T *K, const T *V, int s, int k0, int L, int tid) {
    fl_load_tile<T, P>(S.k(b), K, A.v.ldq, k0, L, tid, A.vec16);
    fl_load_tile<T, P>(S.v(b), V, A.v.ldq, k0, L, tid, A.vec16);
    for (int i = tid; A.v.keymask && i < FL_TILE; i += FL_THREADS) S.bias(b)[i] = fl_mask_term(&A.v, s, k0 + i, L);
    fl_cp_commit();
}

/* The A fragments of a lane's two rows r0, r1 (zero at or past L) of a token-row operand
 * (head columns at X, row stride ld): the block's queries, or their dctx, in registers */
template <typename T, int P>
static __host__ __device__ __forceinline__ void fl_rows_a(uint32_t fr[P / 16][4], const T *X, int64_t ld, int r0,
                                                          int r1, int L, int t) {
    for (int kk = 0; kk < P / 16; kk++)
        for (int e = 0; e < 4; e++) {
            const int r = e & 1 ? r1 : r0, c = kk * 16 + 2 * t + (e >= 2 ? 8 : 0);
            fr[kk][e] = r < L ? *(const uint32_t *)(X + (int64_t)r * ld + c) : 0u;
        }
}

/* Where the query rows of the (sequence, head) at padded element ebase keep a statistic
 * (which: 0 the maximum, 1 the log-sum) at the start of probs: B H J fp32 each, one after
 * the other */
static __host__ __device__ __forceinline__ float *fl_stats(const dmc_varlen *v, uint64_t ebase, int which) {
    return (float *)v->probs + (uint64_t)which * (uint64_t)(v->B * v->H * v->J) + ebase;
}
/* One (sequence, head)'s operands: its token rows' head columns (Q, K, V; dctx in the
 * backward), its first padded element (element (s, h, j, k) at (ebase + j) J + k: the
 * dropout's key), and its query rows' statistics: the maximum and the log-sum in probs (B H J
 * fp32 each, one after the other), D in the backward's work space. */
template <typename T> struct fl_head {
    const T *q, *k, *v, *dO;
    uint64_t ebase;
    float *mx, *ls;
    const float *d;
};
template <typename T, int P>
static __host__ __device__ __forceinline__ fl_head<T> fl_head_of(const dmc_varlen *v, int s, int h) {
    const int64_t o = v->off[s], hc = (int64_t)h * P;
    fl_head<T> x;
    x.q = (const T *)v->q + o * v->ldq + hc;
    x.k = (const T *)v->k + o * v->ldq + hc;
    x.v = (const T *)v->v + o * v->ldq + hc;
    x.dO = v->bwd ? (const T *)v->dctx + o * v->ldc + hc : NULL;
    x.ebase = ((uint64_t)s * (uint64_t)v->H + (uint64_t)h) * (uint64_t)v->J;
    x.mx = fl_stats(v, x.ebase, 0);
    x.ls = fl_stats(v, x.ebase, 1);
    x.d = v->bwd ? v->fl_d + x.ebase : NULL;
    return x;
}

/* S = Q K^T for MT of a warp's 16-row query tiles against a 64-key tile: sc[mt][n] the keys
 * n * 8 .. (each K fragment loaded once for all MT); and acc (MT x 16 rows x P) += X (a
 * warp's accumulators, rounded to T as the next MMA's A operand) times a shared 64 x P tile
 * (V in the forward, K for dQ; each fragment once). A warp of one tile passes its arrays'
 * addresses (&sc: MT = 1). */
template <typename T, int P, int MT>
static __host__ __device__ __forceinline__ void fl_scores(float sc[MT][8][4], uint32_t qa[MT][P / 16][4],
                                                          const T *Ks, int g, int t) {
    FL_UNROLL
    for (int mt = 0; mt < MT; mt++)
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) sc[mt][n][e] = 0.0f;
    FL_UNROLL
    for (int kk = 0; kk < P / 16; kk++)
        FL_UNROLL
        for (int n = 0; n < 8; n += 2) {
            uint32_t b[4];
            fl_frag_bt2<T, P + 8>(b, Ks, n * 8, kk * 16, g, t);
            FL_UNROLL
            for (int mt = 0; mt < MT; mt++) {
                fl_mma<T>(sc[mt][n], qa[mt][kk], b);
                fl_mma<T>(sc[mt][n + 1], qa[mt][kk], b + 2);
            }
        }
}
template <typename T, int P, int MT>
static __host__ __device__ __forceinline__ void fl_times_tile(float acc[MT][P / 8][4], float x[MT][8][4],
                                                              const T *tile, int g, int t) {
    FL_UNROLL
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[MT][4];
        FL_UNROLL
        for (int mt = 0; mt < MT; mt++) fl_c_to_a<T>(a[mt], x[mt][2 * kk], x[mt][2 * kk + 1]);
        FL_UNROLL
        for (int n = 0; n < P / 8; n += 2) {
            uint32_t bf[4];
            fl_frag_b2<T, P + 8>(bf, tile, kk * 16, n * 8, g, t);
            FL_UNROLL
            for (int mt = 0; mt < MT; mt++) {
                fl_mma<T>(acc[mt][n], a[mt], bf);
                fl_mma<T>(acc[mt][n + 1], a[mt], bf + 2);
            }
        }
    }
}

/* The forward for 64 MT queries, a warp per 16 MT (MT tiles of 16 rows: MT = 2 loads each K
 * and V fragment once for twice the products, with twice the registers; dmc_flash_run's
 * DMOVE_CUDA_FLASH_MT) */
template <typename T, int P, int MT>
static __host__ __device__ void fl_fwd_block(const fl_args &A, int tid, int qb, int h, int s, char *smem) {
    const dmc_varlen *v = &A.v;
    const fl_kv_smem<T, P> S = {smem};
    const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int o = v->off[s], L = v->off[s + 1] - o, q0 = qb * FL_TILE * MT;
    if (q0 >= L) return; /* the whole block: no barrier is left waiting */
    const int64_t J = v->J, hc = (int64_t)h * P;
    const fl_head<T> hd = fl_head_of<T, P>(v, s, h);
    const T *Q = hd.q, *K = hd.k, *V = hd.v;
    int rw[MT][2]; /* this lane's query rows: tile mt's g and g + 8 */
    uint32_t qa[MT][P / 16][4];
    float acc[MT][P / 8][4], m[MT][2], l[MT][2];
    uint64_t er[MT][2];
    FL_UNROLL
    for (int mt = 0; mt < MT; mt++) {
        rw[mt][0] = q0 + (w * MT + mt) * 16 + g, rw[mt][1] = rw[mt][0] + 8;
        fl_rows_a<T, P>(qa[mt], Q, v->ldq, rw[mt][0], rw[mt][1], L, t);
        for (int i = 0; i < 2; i++) {
            m[mt][i] = -INFINITY, l[mt][i] = 0.0f;
            er[mt][i] = (hd.ebase + (uint64_t)rw[mt][i]) * (uint64_t)J;
        }
        for (int n = 0; n < P / 8; n++)
            for (int e = 0; e < 4; e++) acc[mt][n][e] = 0.0f;
    }
    const int kend = v->causal && q0 + FL_TILE * MT < L ? q0 + FL_TILE * MT : L, causal = v->causal,
              keymask = v->keymask;
    const float alpha = v->alpha;
    fl_load_kv<T, P>(A, S, 0, K, V, s, 0, L, tid);
    for (int k0 = 0, b = 0; k0 < kend; k0 += FL_TILE, b ^= 1) {
        fl_cp_wait<0>(); /* this tile has landed; every warp is past the other buffer: the next tile's */
        fl_sync();
        if (k0 + FL_TILE < kend) fl_load_kv<T, P>(A, S, b ^ 1, K, V, s, k0 + FL_TILE, L, tid);
        uint32_t keep[MT];
        FL_UNROLL
        for (int mt = 0; mt < MT; mt++) keep[mt] = fl_keep_rows(v, A.rk, er[mt][0] + (uint64_t)k0, er[mt][1] + (uint64_t)k0, t);
        float sc[MT][8][4];
        fl_scores<T, P, MT>(sc, qa, S.k(b), g, t);
        FL_UNROLL
        for (int mt = 0; mt < MT; mt++) {
            fl_logits(sc[mt], S.bias(b), keymask, alpha, k0, rw[mt][0] - g, L, causal, g, t);
            float mx[2] = {-INFINITY, -INFINITY};
            FL_UNROLL
            for (int n = 0; n < 8; n++)
                FL_UNROLL
                for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[mt][n][e]);
            float corr[2], base[2];
            for (int i = 0; i < 2; i++) {
                const float mn = fmaxf(m[mt][i], fl_quad_max(mx[i]));
                base[i] = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet: every term 0 */
                corr[i] = fl_exp(m[mt][i] - base[i]);
                m[mt][i] = mn;
                l[mt][i] *= corr[i];
            }
            for (int n = 0; n < P / 8; n++)
                for (int e = 0; e < 4; e++) acc[mt][n][e] *= corr[e >> 1];
            FL_UNROLL
            for (int n = 0; n < 8; n++)
                FL_UNROLL
                for (int e = 0; e < 4; e++) {
                    const float p = fl_exp(sc[mt][n][e] - base[e >> 1]);
                    l[mt][e >> 1] += p;
                    sc[mt][n][e] = keep[mt] >> (4 * n + e) & 1 ? p : 0.0f;
                }
        }
        fl_times_tile<T, P, MT>(acc, sc, S.v(b), g, t); /* O += dropped(P) V */
    }
    T *C = (T *)v->ctx + (int64_t)o * v->ldc + hc;
    FL_UNROLL
    for (int mt = 0; mt < MT; mt++)
        for (int i = 0; i < 2; i++) {
            const float sum = fl_quad_sum(l[mt][i]);
            const int row = rw[mt][i];
            const float inv = sum > 0.0f ? (v->drop ? v->scale : 1.0f) / sum : 0.0f;
            if (row >= L) continue;
            for (int n = 0; n < P / 8; n++) {
                const uint32_t wd = fl_pack<T>(acc[mt][n][2 * i] * inv, acc[mt][n][2 * i + 1] * inv);
                *(uint32_t *)(C + (int64_t)row * v->ldc + n * 8 + 2 * t) = wd;
            }
            if (t == 0) { /* the maximum, then the log of the sum past it (ops.def's all-masked rows) */
                hd.mx[row] = m[mt][i];
                hd.ls[row] = logf(sum);
            }
        }
}

/* ---- backward ---------------------------------------------------------------------------- */

#ifndef __CUDA_ARCH__
/* D[s h j] = sum_p dctx * ctx over the head's P columns, fp32: the emulation's (the device's:
 * fl_rowdot_kernel) */
static void fl_rowdot(const dmc_varlen *v, int64_t s, int64_t j, int64_t h) {
    const int o = v->off[s], L = v->off[s + 1] - o;
    if (j >= L) return;
    float d = 0.0f;
    for (int64_t p = 0; p < v->P; p++)
        d += dmc_load(v->dctx, v->dt, (o + j) * v->ldc + h * v->P + p) *
             dmc_load(v->ctx, v->dt, (o + j) * v->ldo + h * v->P + p);
    v->fl_d[(s * v->H + h) * v->J + j] = d;
}
#endif

/* Shared memory of the dK dV block: its K and V tiles, and two buffers of a query tile's
 * Q and dctx rows and the rows' maximum, log-sum and D (the next tile's loading while
 * this one's is read). */
template <typename T, int P> struct fl_q_smem {
    enum { TILE = FL_TILE * (P + 8) };
    char *base;
    __host__ __device__ T *k() const { return (T *)base; }
    __host__ __device__ T *v() const { return (T *)base + TILE; }
    __host__ __device__ T *q(int b) const { return (T *)base + 2 * TILE * (b + 1); }
    __host__ __device__ T *o(int b) const { return (T *)base + 2 * TILE * (b + 1) + TILE; }
    __host__ __device__ float *stat(int b, int which) const { /* which: 0 maximum, 1 log-sum, 2 D */
        return (float *)((T *)base + 6 * TILE) + FL_TILE * (3 * b + which);
    }
};

/* query tile q0's Q and dctx rows (one group of copies) and statistics into buffer b */
template <typename T, int P>
static __host__ __device__ __forceinline__ void fl_load_q(const fl_args &A, const fl_q_smem<T, P> &S, int b,
                                                          const T *Q, const T *dO, const float *mx, const float *ls,
                                                          const float *D, int q0, int L, int tid) {
    fl_load_tile<T, P>(S.q(b), Q, A.v.ldq, q0, L, tid, A.vec16);
    fl_load_tile<T, P>(S.o(b), dO, A.v.ldc, q0, L, tid, A.vec16);
    for (int i = tid; i < FL_TILE; i += FL_THREADS) {
        S.stat(b, 0)[i] = q0 + i < L ? mx[q0 + i] : 0.0f;
        S.stat(b, 1)[i] = q0 + i < L ? ls[q0 + i] : 0.0f;
        S.stat(b, 2)[i] = q0 + i < L ? D[q0 + i] : 0.0f;
    }
    fl_cp_commit();
}

/* dK and dV for 64 keys (a warp per 16), walking the query tiles: P^T = exp(alpha K Q^T +
 * mask - m - log sum) again, dV += dropped(P)^T dctx, dP^T = V dctx^T, dS^T = P^T
 * (dropout_bwd(dP^T) - D), dK += dS^T Q, all in registers. */
template <typename T, int P>
static __host__ __device__ void fl_bwd_block(const fl_args &A, int tid, int kb, int h, int s, char *smem) {
    const dmc_varlen *v = &A.v;
    enum { LDS = P + 8 };
    const fl_q_smem<T, P> S = {smem};
    const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int o = v->off[s], L = v->off[s + 1] - o, k0 = kb * FL_TILE;
    if (k0 >= L) return;
    const int64_t J = v->J, hc = (int64_t)h * P;
    /* its own pointers, not fl_head_of's: with the struct ptxas spills this kernel at P=128 */
    const T *Q = (const T *)v->q + (int64_t)o * v->ldq + hc, *K = (const T *)v->k + (int64_t)o * v->ldq + hc,
            *V = (const T *)v->v + (int64_t)o * v->ldq + hc, *dO = (const T *)v->dctx + (int64_t)o * v->ldc + hc;
    const uint64_t ebase = ((uint64_t)s * (uint64_t)v->H + (uint64_t)h) * (uint64_t)J;
    const float *mx = fl_stats(v, ebase, 0), *ls = fl_stats(v, ebase, 1), *D = v->fl_d + ebase;
    const float sc = v->drop ? v->scale : 1.0f;
    fl_load_tile<T, P>(S.k(), K, v->ldq, k0, L, tid, A.vec16); /* with the first query tile's group */
    fl_load_tile<T, P>(S.v(), V, v->ldq, k0, L, tid, A.vec16);
    const int qstart = v->causal ? k0 : 0;
    fl_load_q<T, P>(A, S, 0, Q, dO, mx, ls, D, qstart, L, tid);
    float dk[P / 8][4], dv[P / 8][4];
    for (int n = 0; n < P / 8; n++)
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    const int key0 = k0 + w * 16 + g, key1 = key0 + 8; /* this lane's two keys */
    const float kb0 = v->keymask ? fl_mask_term(v, s, key0, L) : 0.0f,
                kb1 = v->keymask ? fl_mask_term(v, s, key1, L) : 0.0f;
    /* (v's fields read where used, not held: at P = 128 every register counts) */
    for (int q0 = qstart, b = 0; q0 < L; q0 += FL_TILE, b ^= 1) {
        fl_cp_wait<0>(); /* this tile has landed; every warp is past the other buffer: the next tile's */
        fl_sync();
        if (q0 + FL_TILE < L) fl_load_q<T, P>(A, S, b ^ 1, Q, dO, mx, ls, D, q0 + FL_TILE, L, tid);
        const T *Qs = S.q(b), *Os = S.o(b);
        /* from (query q0 + 2t, the warp's first key) */
        uint32_t keep = fl_keep_cols(v, A.rk, (ebase + (uint64_t)(q0 + 2 * t)) * (uint64_t)J + (uint64_t)(k0 + w * 16), g);
        float st[8][4], dp[8][4]; /* S^T, then P^T; dP^T, then dS^T: 16 keys x 64 queries */
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) st[n][e] = dp[n][e] = 0.0f;
        for (int kk = 0; kk < P / 16; kk++) {
            uint32_t ak[4], av[4];
            fl_frag_a<T, LDS>(ak, S.k(), w * 16, kk * 16, g, t);
            fl_frag_a<T, LDS>(av, S.v(), w * 16, kk * 16, g, t);
            for (int n = 0; n < 8; n += 2) {
                uint32_t bf[4];
                fl_frag_bt2<T, LDS>(bf, Qs, n * 8, kk * 16, g, t);
                fl_mma<T>(st[n], ak, bf);
                fl_mma<T>(st[n + 1], ak, bf + 2);
                fl_frag_bt2<T, LDS>(bf, Os, n * 8, kk * 16, g, t);
                fl_mma<T>(dp[n], av, bf);
                fl_mma<T>(dp[n + 1], av, bf + 2);
            }
        }
        float pd[8][4]; /* dropped P^T, scaled */
        FL_UNROLL
        for (int n = 0; n < 8; n++) {
            const float2 m2 = *(const float2 *)(S.stat(b, 0) + n * 8 + 2 * t),
                         l2 = *(const float2 *)(S.stat(b, 1) + n * 8 + 2 * t);
            FL_UNROLL
            for (int e = 0; e < 4; e++)
                st[n][e] = fl_exp(st[n][e] * v->alpha + (e >= 2 ? kb1 : kb0) - (e & 1 ? m2.y : m2.x) -
                                  (e & 1 ? l2.y : l2.x));
        }
        /* Only a tile with queries at or past L, or across the diagonal, tests each element
         * (the warp's keys k0 + 16 w ..). Keys at or past L need no test: their K rows are
         * zeros, so their terms may overflow (a sequence all masked: e^(FLT_MAX - log-sum)),
         * but a row of dK and dV takes only its own key's, and theirs are not written. */
        if (q0 + FL_TILE > L || (v->causal && k0 + w * 16 + 15 > q0)) {
            FL_UNROLL
            for (int n = 0; n < 8; n++)
                FL_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int key = e >= 2 ? key1 : key0, q = q0 + n * 8 + 2 * t + (e & 1);
                    if (q >= L || (v->causal && key > q)) st[n][e] = 0.0f, keep &= ~(1u << (4 * n + e));
                }
        }
        FL_UNROLL
        for (int n = 0; n < 8; n++) {
            const float2 d2 = *(const float2 *)(S.stat(b, 2) + n * 8 + 2 * t);
            FL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int kept = keep >> (4 * n + e) & 1;
                const float p = st[n][e];
                pd[n][e] = kept ? p * sc : 0.0f;
                dp[n][e] = p * ((kept ? dp[n][e] * sc : 0.0f) - (e & 1 ? d2.y : d2.x)); /* dS^T */
            }
        }
        FL_UNROLL
        for (int kk = 0; kk < 4; kk++) { /* dV += Pd^T dO, dK += dS^T Q (alpha at the end) */
            uint32_t ap[4], as[4];
            fl_c_to_a<T>(ap, pd[2 * kk], pd[2 * kk + 1]);
            fl_c_to_a<T>(as, dp[2 * kk], dp[2 * kk + 1]);
            for (int n = 0; n < P / 8; n += 2) {
                uint32_t bf[4];
                fl_frag_b2<T, LDS>(bf, Os, kk * 16, n * 8, g, t);
                fl_mma<T>(dv[n], ap, bf);
                fl_mma<T>(dv[n + 1], ap, bf + 2);
                fl_frag_b2<T, LDS>(bf, Qs, kk * 16, n * 8, g, t);
                fl_mma<T>(dk[n], as, bf);
                fl_mma<T>(dk[n + 1], as, bf + 2);
            }
        }
    }
    T *dK = (T *)v->dk + (int64_t)o * v->ldd + hc, *dV = (T *)v->dv + (int64_t)o * v->ldd + hc;
    for (int i = 0; i < 2; i++) {
        const int key = i ? key1 : key0;
        if (key >= L) continue;
        for (int n = 0; n < P / 8; n++) {
            *(uint32_t *)(dK + (int64_t)key * v->ldd + n * 8 + 2 * t) =
                fl_pack<T>(dk[n][2 * i] * v->alpha, dk[n][2 * i + 1] * v->alpha);
            *(uint32_t *)(dV + (int64_t)key * v->ldd + n * 8 + 2 * t) = fl_pack<T>(dv[n][2 * i], dv[n][2 * i + 1]);
        }
    }
}

/* dQ for 64 queries (a warp per 16, as the forward), walking the key tiles: S = alpha Q
 * K^T + mask, P = exp(S - m - log sum), dP = dctx V^T, dS = P (dropout_bwd(dP) - D) again
 * (the dK dV block's, computed a second time), dQ += dS K in registers: every key tile's
 * share summed in order there, so no partial sums go to memory and the bits are the same
 * every run. */
template <typename T, int P>
static __host__ __device__ void fl_dq_block(const fl_args &A, int tid, int qb, int h, int s, char *smem) {
    const dmc_varlen *v = &A.v;
    enum { LDS = P + 8 };
    const fl_kv_smem<T, P> S = {smem};
    const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int o = v->off[s], L = v->off[s + 1] - o, q0 = qb * FL_TILE;
    if (q0 >= L) return;
    const int64_t J = v->J, hc = (int64_t)h * P;
    const fl_head<T> hd = fl_head_of<T, P>(v, s, h);
    const T *Q = hd.q, *K = hd.k, *V = hd.v, *dO = hd.dO;
    const int r0 = q0 + w * 16 + g, r1 = r0 + 8;
    uint32_t qa[P / 16][4], oa[P / 16][4];
    fl_rows_a<T, P>(qa, Q, v->ldq, r0, r1, L, t);
    fl_rows_a<T, P>(oa, dO, v->ldc, r0, r1, L, t);
    const uint64_t ebase = hd.ebase;
    float mrow[2], lrow[2], drow[2];
    for (int i = 0; i < 2; i++) {
        const int row = i ? r1 : r0;
        mrow[i] = row < L ? hd.mx[row] : 0.0f;
        lrow[i] = row < L ? hd.ls[row] : 0.0f;
        drow[i] = row < L ? hd.d[row] : 0.0f;
    }
    float dq[P / 8][4];
    for (int n = 0; n < P / 8; n++)
        for (int e = 0; e < 4; e++) dq[n][e] = 0.0f;
    const float scl = v->drop ? v->scale : 1.0f, alpha = v->alpha;
    const int kend = v->causal && q0 + FL_TILE < L ? q0 + FL_TILE : L, causal = v->causal, keymask = v->keymask;
    const uint64_t er0 = (ebase + (uint64_t)r0) * (uint64_t)J, er1 = (ebase + (uint64_t)r1) * (uint64_t)J;
    fl_load_kv<T, P>(A, S, 0, K, V, s, 0, L, tid);
    for (int k0 = 0, b = 0; k0 < kend; k0 += FL_TILE, b ^= 1) {
        fl_cp_wait<0>();
        fl_sync();
        if (k0 + FL_TILE < kend) fl_load_kv<T, P>(A, S, b ^ 1, K, V, s, k0 + FL_TILE, L, tid);
        const uint32_t keep = fl_keep_rows(v, A.rk, er0 + (uint64_t)k0, er1 + (uint64_t)k0, t);
        float sc[8][4], dp[8][4];
        fl_scores<T, P, 1>(&sc, &qa, S.k(b), g, t);
        fl_scores<T, P, 1>(&dp, &oa, S.v(b), g, t); /* dP = dctx V^T: V's rows as K's */
        fl_logits(sc, S.bias(b), keymask, alpha, k0, r0 - g, L, causal, g, t); /* -inf where masked */
        FL_UNROLL
        for (int n = 0; n < 8; n++)
            FL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const float p = fl_exp(sc[n][e] - mrow[i] - lrow[i]);
                sc[n][e] = p * ((keep >> (4 * n + e) & 1 ? dp[n][e] * scl : 0.0f) - drow[i]); /* dS */
            }
        fl_times_tile<T, P, 1>(&dq, &sc, S.k(b), g, t); /* dQ += dS K */
    }
    T *dQ = (T *)v->dq + (int64_t)o * v->ldd + hc;
    for (int i = 0; i < 2; i++) {
        const int row = i ? r1 : r0;
        if (row >= L) continue;
        for (int n = 0; n < P / 8; n++)
            *(uint32_t *)(dQ + (int64_t)row * v->ldd + n * 8 + 2 * t) =
                fl_pack<T>(dq[n][2 * i] * v->alpha, dq[n][2 * i + 1] * v->alpha);
    }
}

/* ---- launches ---------------------------------------------------------------------------- */

/* A block's shared memory, 16-bit storage: walking the keys (forward, dQ; fl_kv_smem) two
 * K and V tiles and mask terms; the dK dV block (fl_q_smem) K and V, two Q and dctx tiles
 * and rows' statistics */
static size_t fl_smem(int P, int bwd) {
    return bwd ? (size_t)(6 * FL_TILE * (P + 8)) * 2 + 6 * FL_TILE * sizeof(float)
               : (size_t)(4 * FL_TILE * (P + 8)) * 2 + 2 * FL_TILE * sizeof(float);
}

/* FL_FWD_MINB: the forward's blocks an SM must hold at P = 64, its registers capped to fit
 * (4: 128 a lane, a few spilled; shared memory allows 6). On the H200 (2026-11-28, BERT-large
 * heads, unpadded, full fill) 4 took the forward from 0.156 to 0.148 ms at b=8 j=512 with
 * dropout 0.1 and from 0.105 to 0.095 without, at b=96 j=128 0.135 to 0.126 and 0.100 to 0.094,
 * against 3 blocks at 153 registers uncapped */
#ifndef FL_FWD_MINB
#define FL_FWD_MINB 4
#endif
template <typename T, int P> __global__ void __launch_bounds__(FL_THREADS, P == 64 ? FL_FWD_MINB : 1) fl_fwd_kernel(fl_args A) {
    extern __shared__ __align__(16) char fl_smem_d[];
    fl_fwd_block<T, P, 1>(A, (int)threadIdx.x, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, fl_smem_d);
}
/* 128 queries a block (P = 64 alone: at 128 the registers would not hold two tiles) */
template <typename T> __global__ void __launch_bounds__(FL_THREADS, 2) fl_fwd2_kernel(fl_args A) {
    extern __shared__ __align__(16) char fl_smem_d[];
    fl_fwd_block<T, 64, 2>(A, (int)threadIdx.x, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, fl_smem_d);
}
template <typename T, int P> __global__ void __launch_bounds__(FL_THREADS) fl_bwd_kernel(fl_args A) {
    extern __shared__ __align__(16) char fl_smem_d[];
    fl_bwd_block<T, P>(A, (int)threadIdx.x, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, fl_smem_d);
}
/* D on the device: a block per token row (grid (J, B)), a warp per head, its lanes over
 * the head's columns (coalesced), summed by shuffles (the host's fl_rowdot in another
 * order: the same to fp32 rounding) */
__global__ void fl_rowdot_kernel(dmc_varlen v) {
    const int64_t s = blockIdx.y, j = blockIdx.x, o = v.off[s], L = v.off[s + 1] - o;
    if (j >= L) return;
    for (int64_t h = threadIdx.x / 32; h < v.H; h += blockDim.x / 32) {
        float d = 0.0f;
        for (int64_t p = threadIdx.x % 32; p < v.P; p += 32)
            d += dmc_load(v.dctx, v.dt, (o + j) * v.ldc + h * v.P + p) * dmc_load(v.ctx, v.dt, (o + j) * v.ldo + h * v.P + p);
        for (int k = 16; k > 0; k >>= 1) d += __shfl_xor_sync(0xffffffffu, d, k);
        if (threadIdx.x % 32 == 0) v.fl_d[(s * v.H + h) * v.J + j] = d;
    }
}
/* FL_DQ_MINB: the same for the dQ kernel (1: uncapped, 168 registers at P = 64, 3 blocks an
 * SM; 4 is bench/gpu/variants.sh's first candidate) */
#ifndef FL_DQ_MINB
#define FL_DQ_MINB 1
#endif
template <typename T, int P> __global__ void __launch_bounds__(FL_THREADS, P == 64 ? FL_DQ_MINB : 1) fl_dq_kernel(fl_args A) {
    extern __shared__ __align__(16) char fl_smem_d[];
    fl_dq_block<T, P>(A, (int)threadIdx.x, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, fl_smem_d);
}

template <typename T, int P>
static dm_status fl_run_typed(const dmc_varlen *v, const fl_args &A, int emu, cudaStream_t stream) {
    const int tiles = (int)((v->J + FL_TILE - 1) / FL_TILE), mt = P == 64 && !v->bwd ? A.mt : 1,
              ftiles = (int)((v->J + FL_TILE * mt - 1) / (FL_TILE * mt));
    const size_t smem = fl_smem(P, v->bwd);
    if (emu) {
#ifndef __CUDA_ARCH__
        if (v->bwd)
            for (int64_t s = 0; s < v->B; s++)
                for (int64_t j = 0; j < v->J; j++)
                    for (int64_t h = 0; h < v->H; h++) fl_rowdot(v, s, j, h);
        std::function<void(int, int, int, int, char *)> fn = [&](int tid, int bx, int by, int bz, char *sm) {
            if (v->bwd) fl_bwd_block<T, P>(A, tid, bx, by, bz, sm);
            else if (mt == 2) fl_fwd_block<T, 64, 2>(A, tid, bx, by, bz, sm);
            else fl_fwd_block<T, P, 1>(A, tid, bx, by, bz, sm);
        };
        DM_TRY(fl_sim_run(v->bwd ? tiles : ftiles, (int)v->H, (int)v->B, smem, fn));
        std::function<void(int, int, int, int, char *)> dq = [&](int tid, int bx, int by, int bz, char *sm) {
            fl_dq_block<T, P>(A, tid, bx, by, bz, sm);
        };
        if (v->bwd) DM_TRY(fl_sim_run(tiles, (int)v->H, (int)v->B, fl_smem(P, 0), dq));
#endif
        return DM_OK;
    }
    const dim3 grid((unsigned)tiles, (unsigned)v->H, (unsigned)v->B), pairs((unsigned)v->J, (unsigned)v->B);
    if (v->bwd) {
        fl_rowdot_kernel<<<pairs, 128, 0, stream>>>(*v);
        DMC_CUDA(cudaGetLastError());
        fl_bwd_kernel<T, P><<<grid, FL_THREADS, smem, stream>>>(A);
        DMC_CUDA(cudaGetLastError());
        fl_dq_kernel<T, P><<<grid, FL_THREADS, fl_smem(P, 0), stream>>>(A);
    } else if (mt == 2) {
        fl_fwd2_kernel<T><<<dim3((unsigned)ftiles, (unsigned)v->H, (unsigned)v->B), FL_THREADS, smem, stream>>>(A);
    } else {
        fl_fwd_kernel<T, P><<<grid, FL_THREADS, smem, stream>>>(A);
    }
    DMC_CUDA(cudaGetLastError());
    return DM_OK;
}

template <typename T, int P> static dm_status fl_allow_smem_typed(void) {
    DMC_CUDA(cudaFuncSetAttribute(fl_fwd_kernel<T, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fl_smem(P, 0)));
    if (P == 64)
        DMC_CUDA(cudaFuncSetAttribute(fl_fwd2_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fl_smem(P, 0)));
    DMC_CUDA(cudaFuncSetAttribute(fl_bwd_kernel<T, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fl_smem(P, 1)));
    DMC_CUDA(cudaFuncSetAttribute(fl_dq_kernel<T, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fl_smem(P, 0)));
    return DM_OK;
}

dm_status dmc_flash_allow_smem(const dmc_varlen *v) {
    if (v->dt == DMC_BF16)
        return v->P == 64 ? fl_allow_smem_typed<__nv_bfloat16, 64>() : fl_allow_smem_typed<__nv_bfloat16, 128>();
    return v->P == 64 ? fl_allow_smem_typed<__half, 64>() : fl_allow_smem_typed<__half, 128>();
}

int dm_cuda_flash_off(void) {
    const char *fl = getenv("DMOVE_CUDA_FLASH");
    return fl && !strcmp(fl, "0");
}

const char *dm_cuda_flash_shape_why(int dtype, int64_t head, int64_t seq, int causal, int keymask) {
    if (dtype != DMC_BF16 && dtype != DMC_F16) return "the storage type is fp32 (the tensor cores' kernel takes bf16 or fp16)";
    if (head != 64 && head != 128) return "the head width is neither 64 nor 128";
    if (seq < 4) return "sequences of fewer than 4 positions";
    if (keymask && causal) return "a causal layer with an attention mask";
    return NULL;
}

int dmc_flash_ok(const dmc_varlen *v, size_t smem_max, const char **why) {
    const char *w = dm_cuda_flash_shape_why(v->dt, v->P, v->J, v->causal, v->keymask);
    const size_t need = fl_smem((int)v->P, 1);
    if (!w && smem_max != 0 && smem_max < need) w = "the device's shared memory per block is below the backward's";
    if (!w && (v->B > 65535 || v->H > 65535 || v->J > 65535 * (int64_t)FL_TILE || v->B * v->J > INT32_MAX))
        w = "the batch is beyond the kernel's grid";
    if (!w && ((uintptr_t)v->q % 4 || (uintptr_t)v->k % 4 || (uintptr_t)v->v % 4 || (uintptr_t)v->probs % 4 ||
               (uintptr_t)v->ctx % 4 || v->ldq % 2 || (v->bwd ? v->ldo : v->ldc) % 2))
        w = "an operand is not 4-byte aligned";
    if (why) *why = w;
    return w == NULL;
}

dm_status dmc_flash_bwd_check(const dmc_varlen *v) {
    if ((uintptr_t)v->dctx % 4 || (uintptr_t)v->dq % 4 || (uintptr_t)v->dk % 4 || (uintptr_t)v->dv % 4 ||
        v->ldc % 2 || v->ldd % 2)
        return dm_fail(DM_ERR_UNSUPPORTED, "flash attention backward: the gradients are not 4-byte aligned, "
                       "and the forward kept no probabilities (set DMOVE_CUDA_FLASH=0)");
    return DM_OK;
}

/* The backward's: D, B H J fp32 (dQ is summed in registers: no partials) */
size_t dmc_flash_work_bytes(const dmc_varlen *v) {
    return v->bwd ? (size_t)(v->B * v->H * v->J) * 4 : 0;
}

void dmc_flash_bind(dmc_varlen *v, void *work) { v->fl_d = v->bwd ? (float *)work : NULL; }

dm_status dmc_flash_run(const dmc_varlen *v, uint64_t seed, int emu, cudaStream_t stream) {
    if (v->bwd) DM_TRY(dmc_flash_bwd_check(v));
    fl_args A;
    A.v = *v;
    dmc_philox_keys(seed, A.rk);
    const uintptr_t al = (uintptr_t)v->q | (uintptr_t)v->k | (uintptr_t)v->v |
                         (v->bwd ? (uintptr_t)v->dctx : 0);
    A.vec16 = al % 16 == 0 && v->ldq % 8 == 0 && (!v->bwd || v->ldc % 8 == 0);
    const char *mt = getenv("DMOVE_CUDA_FLASH_MT"); /* 2: the forward's warps take 32 queries each */
    if (mt && *mt && strcmp(mt, "1") && strcmp(mt, "2"))
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_FLASH_MT='%s': 1 (16 queries a warp in the flash forward, the "
                       "default) or 2 (32, at heads of 64)", mt);
    A.mt = mt && !strcmp(mt, "2") ? 2 : 1;
    if (v->dt == DMC_BF16)
        return v->P == 64 ? fl_run_typed<__nv_bfloat16, 64>(v, A, emu, stream)
                          : fl_run_typed<__nv_bfloat16, 128>(v, A, emu, stream);
    return v->P == 64 ? fl_run_typed<__half, 64>(v, A, emu, stream) : fl_run_typed<__half, 128>(v, A, emu, stream);
}
