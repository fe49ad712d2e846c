/* direct_amx.c: the direct kernel on AMX (Intel's tile unit: Sapphire Rapids and later),
 * fp32 in, fp32 out, as accurate as an fp32 FMA chain (direct_isa.h says why and where).
 *
 * Each float x is split into three bfloat16 parts, x = x0 + x1 + x2 + r: x0 the nearest
 * bfloat16 to x, x1 the nearest to x - x0, x2 to x - x0 - x1 (each step exact in fp32),
 * |r| within 2^-26 |x| or so. A product a b is then summed as the six terms that are not
 * below fp32's rounding, a0 b0 + a0 b1 + a1 b0 + a0 b2 + a1 b1 + a2 b0 (a1 b2, a2 b1 and a2 b2
 * are near 2^-26 |a b| or below), each exact in fp32, accumulated by TDPBF16PS in fp32
 * with round-to-nearest, each KC block's sum from zero and then added to C, as the vector
 * variants do. Against a double reference: on the layer's shapes (k 768-3072, random
 * signs) max |error| / sum |a b| 0.4-0.5x that of one fp32 FMA chain; on 8192 positive
 * terms 1.2 units of 2^-24 sum |a b| rms, the AVX-512 variant 1.5 (test_contract).
 * Six bf16 products cost less than one fp32 FMA here:
 * the tile unit does 1024 bf16 multiply-adds a cycle, the two 512-bit FMA units 32.
 *
 * Layouts (bf16 elements, tiles of 16 rows x 64 bytes):
 *   op(A) rows [i0, i0 + mc) x k [k0, k0 + kc): tile (t, c) = rows 16t.., k 32c.., its three
 *     parts at a + ((t kt + c) 3 + p) 512; row r of a part: 32 bf16 in k order.
 *   op(B) k [k0, k0 + kc) x columns [j0, j0 + nc): tile (u, c) = columns 16u.., k 32c..,
 *     parts at b + ((u kt + c) 3 + p) 512, row q: the 16 columns' pairs (k 2q, 2q + 1) (the
 *     tile unit's "VNNI" layout). Rows, columns and k past the block are zero.
 * Blocking: for each KC of k, NC columns of it packed from op(B) (786 KB, L2) at a time,
 * op(A) MC rows at a time (98 KB; all of its rows packed once for every NC block, where a
 * thread's panel can be had; or, where all of op(B)'s columns of the KC block pack into
 * BWHOLE_MOST, those in one block, each MC block of op(A) run across all of them),
 * micro-blocks of 32 x 32 of C in four accumulator tiles, two tiles each of A and B in the
 * other four. Measured on 1 thread of the Xeon (2026-11-29), 512 x 3072 x 768,
 * the sum carried in the tiles across blocks: KC 384 / NC 256 / MC 32 262 GFLOP/s;
 * 256/512/32 241-248; 128/512/64 202; 768/128/32 228 (the AVX-512 kernel: 173-188). With
 * each block's sum from zero (its C pass through the scratch tile) KC 512 beat 384 on the
 * layer's GEMMs (bench/kernels.sh, 1 thread: the weight gradients 224-242 GFLOP/s against
 * 217-240, ffn1 dX 279 against 260).
 *
 * Every element of C is computed alike wherever its micro-block lies: the accumulators
 * start from zero in each KC block, C = alpha sum (+ C after the first block), in full and
 * edge blocks alike (an edge goes through a scratch tile). A split of C between threads
 * therefore changes no result.
 * Limits of the format: a GEMM whose A or B holds a NaN, an inf or a float beyond bf16's
 * largest (|x| > 0x1.fefffep127, 3.39e38: its first part would be inf, and inf times a
 * zero part NaN), or whose sums could come within 1/16 of fp32's overflow (k max|a|
 * max|b| |alpha| > 2^124: a part's product can overflow where a b does not, and inf - inf
 * is NaN), is run again on the AVX-512 variant, which gives fp32's own answer; that
 * choice is made per call, so there a thread split can change which variant computes an
 * element. The tile unit treats subnormal bf16 as zero and flushes subnormal results:
 * subnormal inputs count as 0, a float loses its third part below about 2^-110 and its
 * second below 2^-118, and products below fp32's smallest normal (1.2e-38) are 0. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "cpu/direct_isa.h"

#define KC 512
#define NC 256
#define MC 32

#if DM_GEMM_DIRECT_PACK_FLOATS * 2 < 3 * (KC * NC + MC * KC)
#error "the direct kernel's buffer is too small for the AMX variant's blocks"
#endif

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

/* x0 (lanes 0-15) and x1 (lanes 16-31) as three bf16 parts, 32 bf16 each in that order;
 * *odd set where a lane is NaN, inf or beyond bf16's largest finite value (its parts would
 * give inf x 0 = NaN among the six products), *mx the lanes' largest magnitudes so far:
 * the caller runs the GEMM on the vector units where either could leave fp32's answer */
static inline __attribute__((always_inline)) AMX_TARGET void split3(__m512 x0, __m512 x1, __m512i out[3],
                                                                    __mmask16 *odd, __m512 *mx) {
    const __m512 big = _mm512_set1_ps(0x1.fefffep+127f); /* above it, bf16 rounds to inf */
    const __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
    *odd |= _mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ);
    *mx = _mm512_max_ps(*mx, _mm512_max_ps(a0, a1));
    for (int p = 0; p < 3; p++) {
        const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        out[p] = h;
        if (p == 2) break;
        const __m512 f0 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
        const __m512 f1 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
        x0 = _mm512_sub_ps(x0, f0);
        x1 = _mm512_sub_ps(x1, f1);
    }
}

/* r[q] lane L <- r[L] lane q: 16 x 16 dwords transposed */
static inline __attribute__((always_inline)) AMX_TARGET void transpose16d(__m512i r[16]) {
    __m512i t[16];
    for (int q = 0; q < 16; q += 2) {
        t[q] = _mm512_unpacklo_epi32(r[q], r[q + 1]);
        t[q + 1] = _mm512_unpackhi_epi32(r[q], r[q + 1]);
    }
    for (int q = 0; q < 16; q += 4)
        for (int h = 0; h < 2; h++) {
            r[q + h] = _mm512_unpacklo_epi64(t[q + h], t[q + 2 + h]);
            r[q + 2 + h] = _mm512_unpackhi_epi64(t[q + h], t[q + 2 + h]);
        }
    static const int c_of[4] = {0, 2, 1, 3}; /* as direct_avx512.c's transpose16 */
    for (int q = 0; q < 4; q++) {
        const __m512i a0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x88), a1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xDD),
                      b0 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x88),
                      b1 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xDD);
        const int c = c_of[q];
        t[c] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
        t[4 + c] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
    }
    for (int q = 0; q < 16; q++) r[q] = t[q];
}

/* n (may be <= 0 or > 16) of the 16 floats at p, the rest 0 */
static inline __attribute__((always_inline)) AMX_TARGET __m512 load_n(const float *p, int n) {
    if (n >= 16) return _mm512_loadu_ps(p);
    if (n <= 0) return _mm512_setzero_ps();
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}

/* 32 bf16 of lanes 0-15 then 16-31 -> pairs (lane i, lane 16 + i) */
static inline __attribute__((always_inline)) AMX_TARGET __m512i interleave_halves(__m512i v) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, v);
}

/* Rows [r0, r0 + rc) of one operand by its k [k0, k0 + kc) into tiles: tile (t, c) = rows
 * 16t.., k 32c.., its three parts at d + ((t kt + c) 3 + p) 512. The operand's element (r,
 * k) is X[r ldx + k] (k_contig: a row's k contiguous) or X[k ldx + r]. pair_rows 0: a
 * tile row per operand row, 32 k in order (op(A)'s layout); 1: a tile row per pair of k
 * (2q, 2q + 1), the 16 rows' pairs side by side (op(B)'s "VNNI" layout). Read as the
 * operand lies (a row's 32 k, or k rows 2q and 2q + 1 across the 16 rows as pairs) and
 * transposed 16 x 16 dwords where that is not the tile's layout. Rows and k past the
 * block are zero. Returns the block's largest |x|, inf where split3 found it odd. */
static AMX_TARGET float pack_tiles(uint16_t *d, int k_contig, int pair_rows, const float *X, int64_t ldx, int r0,
                                   int rc, int k0, int kc) {
    __mmask16 odd = 0;
    __m512 mx = _mm512_setzero_ps();
    const int rt = (rc + 15) / 16, kt = (kc + 31) / 32, transpose = k_contig == pair_rows;
    /* the tiles in the order the operand lies: a row's k in turn (k_contig), else the 32 k
     * rows' next 64 bytes in turn (16 rows or columns further), so that each line read
     * follows the one before it in its row; by rows of tiles first, a k row was read 64
     * bytes at a time rt tiles apart, each line a miss the prefetchers did not foresee */
    for (int it = 0; it < rt * kt; it++) {
        const int t = k_contig ? it / kt : it % rt, c = k_contig ? it % kt : it / rt;
        uint16_t *dt = d + (int64_t)(t * kt + c) * 3 * 512;
        const int kk = k0 + 32 * c, kn = kc - 32 * c, rn = rc - 16 * t;
        __m512i v[3][16];
        { /* the next tile's lines asked for now: its 16 rows or 32 k rows lie apart,
           * where the hardware's prefetchers do not follow (a transposed op(A) not in
           * cache, 2 KB rows: 64 GFLOP/s without, 1 thread). The 32 k rows' lines into
           * L2 only: rows a multiple of 4 KiB apart (the attention's dO, i floats a row)
           * fall into one L1 set, and 32 lines asked into L1 evicted each other there
           * (BERT-large's dV, 1 thread: 79 GFLOP/s, 113 into L2) */
            const int tn = k_contig ? (it + 1) / kt : (it + 1) % rt, cn = k_contig ? (it + 1) % kt : (it + 1) / rt;
            if (tn < rt && cn < kt) { /* past the last tile: tn = rt (k_contig), else cn = kt */
                const int kk1 = k0 + 32 * cn, kn1 = kc - 32 * cn, rn1 = rc - 16 * tn;
                if (k_contig)
                    for (int q = 0; q < 16 && q < rn1; q++) {
                        const float *x = X + (int64_t)(r0 + 16 * tn + q) * ldx + kk1;
                        _mm_prefetch((const char *)x, _MM_HINT_T0);
                        if (kn1 > 16) _mm_prefetch((const char *)(x + 16), _MM_HINT_T0);
                    }
                else
                    for (int q = 0; q < 32 && q < kn1; q++)
                        _mm_prefetch((const char *)(X + (int64_t)(kk1 + q) * ldx + r0 + 16 * tn), _MM_HINT_T1);
            }
        }
        for (int q = 0; q < 16; q++) { /* a row's 32 k, or the pairs of k rows 2q, 2q + 1 */
            __m512i o[3];
            if (k_contig) {
                const float *x = X + (int64_t)(r0 + 16 * t + q) * ldx + kk;
                if (q < rn) split3(load_n(x, kn), load_n(x + 16, kn - 16), o, &odd, &mx);
                else o[0] = o[1] = o[2] = _mm512_setzero_si512();
            } else {
                const float *x = X + (int64_t)(kk + 2 * q) * ldx + r0 + 16 * t;
                const __m512 x0 = 2 * q < kn ? load_n(x, rn) : _mm512_setzero_ps();
                const __m512 x1 = 2 * q + 1 < kn ? load_n(x + ldx, rn) : _mm512_setzero_ps();
                split3(x0, x1, o, &odd, &mx);
                for (int p = 0; p < 3; p++) o[p] = interleave_halves(o[p]);
            }
            for (int p = 0; p < 3; p++) {
                if (transpose) v[p][q] = o[p];
                else _mm512_storeu_si512(dt + p * 512 + q * 32, o[p]);
            }
        }
        if (transpose)
            for (int p = 0; p < 3; p++) {
                transpose16d(v[p]);
                for (int q = 0; q < 16; q++) _mm512_storeu_si512(dt + p * 512 + q * 32, v[p][q]);
            }
    }
    return odd ? INFINITY : _mm512_reduce_max_ps(mx);
}

/* The 32 x 32 block of C at c (mr rows, nr columns of it in C) from kt chunks of packed
 * A (row tiles a0, a1) and B (column tiles b0, b1): C = alpha sum, or C += alpha sum (acc:
 * C holds the earlier KC blocks'). Each block's sum starts from zero, as the vector
 * variants' do (a sum carried through all of k in the tiles lost accuracy as k grew: at
 * k = 4096, 4.4 units of 2^-24 sum |a b| rms against 1.1 so). */
static AMX_TARGET void block(int kt, const uint16_t *a0, const uint16_t *a1, const uint16_t *b0, const uint16_t *b1,
                             float *c, int64_t ldc, int mr, int nr, int acc, float alpha, float *scr) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int ch = 0; ch < kt; ch++) {
        const int64_t o = (int64_t)ch * 3 * 512;
#define LOAD_A(p)                                  \
    do {                                           \
        _tile_loadd(4, a0 + o + (p) * 512, 64);    \
        _tile_loadd(5, a1 + o + (p) * 512, 64);    \
    } while (0)
#define LOAD_B(p)                                  \
    do {                                           \
        _tile_loadd(6, b0 + o + (p) * 512, 64);    \
        _tile_loadd(7, b1 + o + (p) * 512, 64);    \
    } while (0)
#define PRODUCTS()                 \
    do {                           \
        _tile_dpbf16ps(0, 4, 6);   \
        _tile_dpbf16ps(1, 4, 7);   \
        _tile_dpbf16ps(2, 5, 6);   \
        _tile_dpbf16ps(3, 5, 7);   \
    } while (0)
        /* the small terms first: a2 b0, a1 b0, a1 b1, a0 b1, a0 b2, a0 b0 */
        LOAD_A(2);
        LOAD_B(0);
        PRODUCTS();
        LOAD_A(1);
        PRODUCTS();
        LOAD_B(1);
        PRODUCTS();
        LOAD_A(0);
        PRODUCTS();
        LOAD_B(2);
        PRODUCTS();
        LOAD_B(0);
        PRODUCTS();
#undef LOAD_A
#undef LOAD_B
#undef PRODUCTS
    }
    if (mr == 32 && nr == 32 && !acc && alpha == 1.0f) { /* the sum is C: stored from the tiles */
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
        return;
    }
    _tile_stored(0, scr, 128);
    _tile_stored(1, scr + 16, 128);
    _tile_stored(2, scr + 16 * 32, 128);
    _tile_stored(3, scr + 16 * 32 + 16, 128);
    const __m512 al = _mm512_set1_ps(alpha);
    for (int r = 0; r < mr; r++)
        for (int h = 0; h < 2 && nr > 16 * h; h++) {
            const int w = nr - 16 * h;
            const __mmask16 mk = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1);
            float *cr = c + (int64_t)r * ldc + 16 * h;
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(scr + r * 32 + 16 * h), al); /* exact for alpha 1 */
            if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk, cr));
            _mm512_mask_storeu_ps(cr, mk, x);
        }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* A thread's packed op(A) for all m rows of one KC block, kept across the column blocks:
 * packed n / NC times otherwise, which cost a weight gradient (op(A) transposed, gathered
 * 32 rows apart) a fifth of its time. Grown as needed, at most PANEL_MOST bytes; freed
 * when the thread ends. NULL where it cannot be had: the caller packs for each block. */
#define PANEL_MOST ((size_t)48 << 20)
/* Where all of op(B)'s columns of a KC block take at most this (packed, three parts) and
 * there are more than NC of them, the panel holds op(B) instead, packed once per KC block,
 * and each MC block of op(A) is packed once and run across all of them from L1/L2: a
 * short k under a tall C (the MLM decoder's weight gradient, 30522 x 768 x 208) otherwise
 * wrote op(A)'s panel whole to memory and read it back per column block. */
#define BWHOLE_MOST ((size_t)1280 << 10)
static pthread_key_t panel_key;
static pthread_once_t panel_once = PTHREAD_ONCE_INIT;
static int panel_key_ok;
static _Thread_local uint16_t *panel_mem;
static _Thread_local size_t panel_cap;

static void panel_free(void *p) { /* at the thread's end; a GEMM after it allocates again */
    if (p == panel_mem) panel_mem = NULL, panel_cap = 0;
    free(p);
}
static void panel_key_make(void) { panel_key_ok = pthread_key_create(&panel_key, panel_free) == 0; }

static uint16_t *panel_get(size_t elems) {
    if (elems > PANEL_MOST / sizeof(uint16_t)) return NULL;
    if (elems <= panel_cap) return panel_mem;
    if (pthread_once(&panel_once, panel_key_make) != 0 || !panel_key_ok) return NULL;
    const size_t bytes = (elems * sizeof(uint16_t) + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes);
    if (!p || pthread_setspecific(panel_key, p) != 0) {
        free(p);
        return NULL;
    }
    free(panel_mem); /* its key now holds p */
    panel_mem = p;
    panel_cap = bytes / sizeof(uint16_t);
    return panel_mem;
}

AMX_TARGET void dm_sgemm_direct_amx(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                                    const float *B, int ldb, float *C, int ldc, float *buf) {
    if (k <= 0 || m <= 0 || n <= 0) {
        for (int i = 0; i < m && n > 0; i++) memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    tile_config cf;
    memset(&cf, 0, sizeof cf);
    cf.palette = 1;
    for (int t = 0; t < 8; t++) cf.rows[t] = 16, cf.colsb[t] = 64;
    _tile_loadconfig(&cf);
    float scr[32 * 32] __attribute__((aligned(64)));
    uint16_t *bp = (uint16_t *)buf, *ap = bp + (int64_t)3 * KC * NC;
    /* op(A) packed once for every column block: all m rows of a KC block (see panel_get);
     * without it (one column block, or no memory), again for each; or, where bw holds all
     * of op(B)'s columns (BWHOLE_MOST), one column block of all n */
    const int kt_most = ((k < KC ? k : KC) + 31) / 32;
    const int64_t ablock = (int64_t)2 * kt_most * 1536; /* one MC block's packed tiles */
    const int64_t bwhole = (int64_t)((n + 15) / 16) * kt_most * 1536; /* all of op(B)'s columns, one KC block */
    uint16_t *bw = n > NC && (size_t)bwhole * sizeof(uint16_t) <= BWHOLE_MOST ? panel_get((size_t)bwhole) : NULL;
    uint16_t *panel = n > NC && !bw ? panel_get((size_t)((m + MC - 1) / MC) * (size_t)ablock) : NULL;
    /* the largest |a| and |b| (inf: a NaN, inf or float past bf16's range) */
    float amax = 0, bmax = 0;
    uint16_t *const bb = bw ? bw : bp;
    const int ncb = bw ? n : NC;
    for (int k0 = 0; k0 < k && bmax < INFINITY; k0 += KC) {
        const int kc = k - k0 < KC ? k - k0 : KC, kt = (kc + 31) / 32;
        for (int j0 = 0; j0 < n && bmax < INFINITY; j0 += ncb) {
            const int nc = n - j0 < ncb ? n - j0 : ncb;
            const float bm = pack_tiles(bb, transB, 1, B, ldb, j0, nc, k0, kc);
            bmax = bm > bmax ? bm : bmax;
            for (int ib = 0; ib < m && bmax < INFINITY; ib += MC) {
                const int mc = m - ib < MC ? m - ib : MC;
                uint16_t *a = panel ? panel + (int64_t)(ib / MC) * ablock : ap;
                if (!panel || j0 == 0) {
                    const float am = pack_tiles(a, !transA, 0, A, lda, ib, mc, k0, kc);
                    amax = am > amax ? am : amax;
                    if (amax == INFINITY) {
                        bmax = INFINITY;
                        break;
                    }
                }
                for (int j = 0; j < nc; j += 32)
                    for (int i = 0; i < mc; i += 32) {
                        const int mr = mc - i < 32 ? mc - i : 32, nr = nc - j < 32 ? nc - j : 32;
                        const uint16_t *a0 = a + (int64_t)(i / 16) * kt * 1536, *b0 = bb + (int64_t)(j / 16) * kt * 1536;
                        /* a block's second row (column) tile past the edge: the first again,
                         * its products landing in rows (columns) that are not stored */
                        const uint16_t *a1 = mr > 16 ? a0 + (int64_t)kt * 1536 : a0;
                        const uint16_t *b1 = nr > 16 ? b0 + (int64_t)kt * 1536 : b0;
                        block(kt, a0, a1, b0, b1, C + (int64_t)(ib + i) * ldc + j0 + j, ldc, mr, nr, k0 > 0, alpha,
                              scr);
                    }
            }
        }
    }
    _tile_release();
    /* Where an input is odd, or a sum could come near fp32's overflow (k max|a| max|b| |alpha|
     * past 2^124, 1/16 of FLT_MAX: the parts' products run to (1 + 2^-8)^2 |a b|, one part
     * product can overflow where a b does not, and inf - inf is NaN where fp32 has inf),
     * the vector units give fp32's own answer. */
    const double bound = (double)amax * bmax * k * (fabsf(alpha) > 1 ? fabsf(alpha) : 1);
    if (!(bound <= 0x1p124)) dm_sgemm_direct_avx512(transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
}
