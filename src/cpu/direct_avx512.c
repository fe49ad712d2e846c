/* direct_avx512.c: dmove's own single-threaded SGEMM for AVX-512 CPUs, the contraction
 * algorithm "direct" (direct.c picks it or direct_avx2.c's at run time). It copies less than BLAS libraries do, which pack both operands:
 *   - op(A) is read in place, one element at a time, broadcast to a vector: any row and
 *     column stride serves (NoTrans and Trans alike);
 *   - op(B) rows are read in place as vectors where dm_direct_b_in_place says (NoTrans,
 *     whole micro-tiles, C shorter than DM_DIRECT_PANEL_M rows and a block of at most
 *     DM_DIRECT_INPLACE_K rows: the attention's per-item GEMMs at j <= 128, and its
 *     transposed-A ones); otherwise op(B) is copied, one KC x NC block at a
 *     time, into the caller's buffer as 64-column panels, each KC x 64 contiguous (a
 *     transposed op(B) by 16 x 16 register transposes);
 *   - C is written once per KC block, with no separate pass that zeroes it (beta = 0).
 * Blocking: NC columns of C by KC of the summed dimension; inside, 6 x 64 micro-tiles
 * (24 vector accumulators), for each strip of 6 rows all the block's 64-column panels.
 * The strip's 6 rows of op(A) (6 KC floats) stay in L1 across the panels; the KC x NC
 * block of op(B) (up to 512 KB), read once per strip, stays in L2.
 * On BERT's shapes this skips OpenBLAS's packing of both operands and its beta pass:
 * it wins most on the attention's per-item GEMMs (128 x 128 x 64), which are too small
 * to amortize them. Correctness: tests/test_contract.c runs it against the reference in
 * every transpose and edge case the executor can produce. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/direct_isa.h"

#define MR 6
#define NV 4
#define NR (16 * NV)
#define KC 256
#define NC 512

/* op(A) transposed (the weight gradients): MCT x KCT blocks of it packed as strips (768
 * KB, in L3, read in order) and KCT x NCT blocks of op(B) (256 KB), as direct_avx2.c does.
 * Read in place, each k of a strip is another row lda apart, fetched again for every
 * block of op(B): on Zen 4 (2026-11-28, bench/kernels.sh) ffn2 dW (768 x 3072 x 1024)
 * ran at 82-85% of the FMA rate that way, packed at 91-93%. Only where op(A) would be
 * read again for more than two blocks of op(B) (n above 2 NC): ffn1 and qkv dW (n 768 or
 * 1024) ran at 86-89% packed against 92-94% in place, BERT-base's and -large's. */
#define KCT 256
#define NCT 256
#define MCT 768
#define PF_A 32 /* packing A^T: the lines this many floats on are fetched ahead */

#if DM_GEMM_DIRECT_PACK_FLOATS < KC * NC || DM_GEMM_DIRECT_PACK_FLOATS < KCT * NCT + MCT * KCT + 16
#error "the direct kernel's buffer is smaller than a block of op(B) and one of op(A)"
#endif

#define DIRECT_TARGET __attribute__((target("avx512f")))

/* c[mr_c x 64] = alpha * sum_k a(r, k) b(k, 0..64) (+ c when acc), columns masked by mk */
static inline __attribute__((always_inline)) DIRECT_TARGET void
tile(int mr_c, int kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
     int64_t ldc, const __mmask16 *mk, int acc, float alpha) {
    __m512 s[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) s[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_ps(b + (int64_t)k * bs + 16 * v);
        const float *ak = a + (int64_t)k * acs;
        for (int r = 0; r < MR; r++) {
            if (r >= mr_c) break;
            __m512 av = _mm512_set1_ps(ak[(int64_t)r * ars]);
            for (int v = 0; v < NV; v++) s[r][v] = _mm512_fmadd_ps(av, bv[v], s[r][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int r = 0; r < MR; r++) {
        if (r >= mr_c) break;
        float *cr = c + (int64_t)r * ldc;
        for (int v = 0; v < NV; v++) {
            __m512 x = _mm512_mul_ps(s[r][v], al);
            if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], cr + 16 * v));
            _mm512_mask_storeu_ps(cr + 16 * v, mk[v], x);
        }
    }
}

/* The lanes of a tile's NV vectors that hold its nr (1..NR) columns. */
static inline void col_masks(int nr, __mmask16 mk[NV]) {
    for (int v = 0; v < NV; v++) {
        const int w = nr - 16 * v;
        mk[v] = w >= 16 ? (__mmask16)0xFFFF : w <= 0 ? (__mmask16)0 : (__mmask16)((1u << w) - 1);
    }
}

/* the row count as a constant, so each variant keeps its accumulators in registers */
static DIRECT_TARGET void tile_rows(int mr, int kc, const float *a, int64_t ars, int64_t acs, const float *b,
                                    int64_t bs, float *c, int64_t ldc, const __mmask16 *mk, int acc,
                                    float alpha) {
    switch (mr) {
    case 6: tile(6, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    case 5: tile(5, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    case 4: tile(4, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    case 3: tile(3, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    case 2: tile(2, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    default: tile(1, kc, a, ars, acs, b, bs, c, ldc, mk, acc, alpha); break;
    }
}

/* 16 x 16 floats transposed: d[c * lds + r] = s[r * ls + c] */
static DIRECT_TARGET void transpose16(float *d, int64_t lds, const float *s, int64_t ls) {
    __m512 r[16], t[16];
    for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_ps(s + (int64_t)q * ls);
    /* 32-bit, then 64-bit interleaves within 128-bit lanes: 4 x 4 blocks transposed */
    for (int q = 0; q < 16; q += 2) {
        t[q] = _mm512_unpacklo_ps(r[q], r[q + 1]);
        t[q + 1] = _mm512_unpackhi_ps(r[q], r[q + 1]);
    }
    for (int q = 0; q < 16; q += 4)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[q + h]), b = _mm512_castps_pd(t[q + 2 + h]);
            r[q + h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[q + 2 + h] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    /* r[4g + q], lane L: column 4L + c(q) of rows 4g..4g+3, c = {0, 2, 1, 3}; the
     * 128-bit lane shuffles gather lane L of the four row blocks into column 4L + c(q) */
    static const int c_of[4] = {0, 2, 1, 3};
    for (int q = 0; q < 4; q++) {
        __m512 a0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88), a1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xDD),
               b0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88),
               b1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xDD);
        const int c = c_of[q];
        t[c] = _mm512_shuffle_f32x4(a0, b0, 0x88);      /* lanes 0 */
        t[8 + c] = _mm512_shuffle_f32x4(a0, b0, 0xDD);  /* lanes 2 */
        t[4 + c] = _mm512_shuffle_f32x4(a1, b1, 0x88);  /* lanes 1 */
        t[12 + c] = _mm512_shuffle_f32x4(a1, b1, 0xDD); /* lanes 3 */
    }
    for (int q = 0; q < 16; q++) _mm512_storeu_ps(d + (int64_t)q * lds, t[q]);
}

/* op(B)[k0 .. k0+kc) x [j0 .. j0+nc) into buf as 64-column panels: row kk of panel q
 * (columns j0 + 64q ..) at buf + q * pstride + kk * 64, columns past nc zeroed. A tile
 * then streams its panel from consecutive addresses instead of rows ldb apart (one page
 * per row when ldb is 1024 floats): BERT-base/small's widest GEMMs ran 1-8% faster. */
void dm_direct_pack_b_avx512(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                             int j0, int nc) {
    dm_direct_pack_panels(buf, pstride, transB, B, ldb, k0, kc, j0, nc, 16, transpose16);
}

/* rows [0, mr) of op(A) = A^T (element (r, k) at a[r + k acs]), columns [0, kc), into d
 * as MR floats per k: a strip that a tile reads as one stream, ars 1, acs MR. 16 floats
 * are stored per k, the 10 past the strip overwritten by the next k's (d has 16 floats
 * of room past the strip's end). */
static DIRECT_TARGET void pack_at(float *d, const float *a, int64_t acs, int mr, int kc) {
    const __mmask16 mk = (__mmask16)((1u << mr) - 1);
    for (int k = 0; k < kc; k++) {
        __builtin_prefetch(a + (int64_t)k * acs + PF_A, 0, 2);
        _mm512_storeu_ps(d + (int64_t)k * MR, _mm512_maskz_loadu_ps(mk, a + (int64_t)k * acs));
    }
}

/* rows [0, mc) of op(A) = A^T as pack_at's strips (strip s at d + s MR kc), KB rows of A
 * (KB values of k) at a time across all the strips: those rows stay in L1 while every
 * strip takes its MR columns of them. A strip at a time (pack_at), its kc rows lda apart
 * fall into few L1 sets (lda 512: two) and come from L2 again for each strip: on the
 * Xeon (2026-11-29, 1 thread, medians of 15 alternations) the attention's dV = P^T dO at
 * j = 512 ran at 89 GFLOP/s that way, 106 so (the weight gradients the same either way) */
#define KB 16
static DIRECT_TARGET void pack_at_rows(float *d, const float *a, int64_t acs, int mc, int kc) {
    const int ns = (mc + MR - 1) / MR;
    for (int kb = 0; kb < kc; kb += KB) {
        const int ke = kb + KB < kc ? kb + KB : kc;
        for (int q = 0; q < ns; q++) {
            const int mr = mc - q * MR < MR ? mc - q * MR : MR;
            const __mmask16 mk = (__mmask16)((1u << mr) - 1);
            float *ds = d + (int64_t)q * MR * kc;
            for (int k = kb; k < ke; k++)
                _mm512_mask_storeu_ps(ds + (int64_t)k * MR, mk, _mm512_maskz_loadu_ps(mk, a + (int64_t)k * acs + q * MR));
        }
    }
}

/* strips [0, mc) of a packed op(A) block (strip s at ap + s * MR * kc) by the KC x NC
 * block of op(B) in panels at bp, into C's columns [0, nc) */
static DIRECT_TARGET void packed_strips(int mc, int kc, int nc, const float *ap, const float *bp, int64_t pstride,
                                        float *c, int ldc, int acc, float alpha) {
    for (int i0 = 0; i0 < mc; i0 += MR) {
        const int mr = mc - i0 < MR ? mc - i0 : MR;
        for (int jr = 0; jr < nc; jr += NR) {
            const int nr = nc - jr < NR ? nc - jr : NR;
            __mmask16 mk[NV];
            col_masks(nr, mk);
            tile_rows(mr, kc, ap + (int64_t)(i0 / MR) * MR * kc, 1, MR, bp + (jr / NR) * pstride, NR,
                      c + (int64_t)i0 * ldc + jr, ldc, mk, acc, alpha);
        }
    }
}

DIRECT_TARGET void dm_sgemm_direct_avx512(int transA, int transB, int m, int n, int k, float alpha, const float *A,
                                   int lda, const float *B, int ldb, float *C, int ldc, float *buf) {
    const int64_t ars = transA ? 1 : lda, acs = transA ? lda : 1;
    if (k <= 0) {
        for (int i = 0; i < m; i++) memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    /* op(A) packed once per KCT deep slice, then the columns in NCT blocks (direct_isa.h) */
    if (transA && (n > (dm_direct_pack_at_always() ? NC : 2 * NC) || (n <= NC && k > KC))) {
        float *ap = buf + (int64_t)KCT * NCT;
        for (int k0 = 0; k0 < k; k0 += KCT) {
            const int kc = k - k0 < KCT ? k - k0 : KCT;
            for (int ib = 0; ib < m; ib += MCT) {
                const int mc = m - ib < MCT ? m - ib : MCT;
                pack_at_rows(ap, A + (int64_t)k0 * lda + ib, lda, mc, kc);
                for (int j0 = 0; j0 < n; j0 += NCT) {
                    const int nc = n - j0 < NCT ? n - j0 : NCT, pstride = kc * NR;
                    dm_direct_pack_b_avx512(buf, pstride, transB, B, ldb, k0, kc, j0, nc);
                    packed_strips(mc, kc, nc, ap, buf, pstride, C + (int64_t)ib * ldc + j0, ldc, k0 > 0, alpha);
                }
            }
        }
        return;
    }
    for (int j0 = 0; j0 < n; j0 += NC) {
        const int nc = n - j0 < NC ? n - j0 : NC;
        for (int k0 = 0; k0 < k; k0 += KC) {
            const int kc = k - k0 < KC ? k - k0 : KC;
            const float *bp = buf;
            int64_t bs = NR, pstride = (int64_t)kc * NR;
            if (dm_direct_b_in_place(transA, transB, m, nc, kc, NR)) {
                bp = B + (int64_t)k0 * ldb + j0;
                bs = ldb;
                pstride = NR;
            } else {
                dm_direct_pack_b_avx512(buf, pstride, transB, B, ldb, k0, kc, j0, nc);
            }
            for (int i0 = 0; i0 < m; i0 += MR) {
                const int mr = m - i0 < MR ? m - i0 : MR;
                const float *a = A + (int64_t)i0 * ars + (int64_t)k0 * acs;
                for (int jr = 0; jr < nc; jr += NR) {
                    const int nr = nc - jr < NR ? nc - jr : NR;
                    __mmask16 mk[NV];
                    col_masks(nr, mk);
                    tile_rows(mr, kc, a, ars, acs, bp + (jr / NR) * pstride, bs, C + (int64_t)i0 * ldc + j0 + jr, ldc,
                              mk, k0 > 0, alpha);
                }
            }
        }
    }
}

/* Row blocks of MC rows (4 micro-tiles, which share each KC x 64 op(B) panel, 64 KB,
 * from L2): a block is finished over all of n and k before the next begins, and handed
 * to done() while its rows are in cache. All of op(B) is read once per block. */
#define MC (4 * MR)

DIRECT_TARGET void dm_sgemm_direct_rows_avx512(int transA, int m, int n, int k, float alpha, const float *A, int lda,
                                        const float *Bp, int64_t ldbp, int64_t pstride, float *C, int ldc,
                                        void (*done)(void *ctx, int i0, int rows), void *ctx) {
    const int64_t ars = transA ? 1 : lda, acs = transA ? lda : 1;
    static _Thread_local float ablk[MC * KC + 16] __attribute__((aligned(64))); /* A^T's strips, packed */
    for (int ib = 0; ib < m; ib += MC) {
        const int mc = m - ib < MC ? m - ib : MC;
        if (k <= 0)
            for (int i = ib; i < ib + mc; i++) memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)n);
        for (int k0 = 0; k0 < k; k0 += KC) {
            const int kc = k - k0 < KC ? k - k0 : KC;
            if (transA)
                for (int i0 = ib; i0 < ib + mc; i0 += MR)
                    pack_at(ablk + (i0 - ib) * KC, A + (int64_t)i0 + (int64_t)k0 * lda, lda,
                            ib + mc - i0 < MR ? ib + mc - i0 : MR, kc);
            for (int jr = 0; jr < n; jr += NR) {
                const int nr = n - jr < NR ? n - jr : NR;
                __mmask16 mk[NV];
                col_masks(nr, mk);
                for (int i0 = ib; i0 < ib + mc; i0 += MR) {
                    const int mr = ib + mc - i0 < MR ? ib + mc - i0 : MR;
                    tile_rows(mr, kc, transA ? ablk + (i0 - ib) * KC : A + (int64_t)i0 * ars + (int64_t)k0 * acs,
                              transA ? 1 : ars, transA ? MR : acs, Bp + (int64_t)k0 * ldbp + (jr / NR) * pstride,
                              ldbp, C + (int64_t)i0 * ldc + jr, ldc, mk, k0 > 0, alpha);
                }
            }
        }
        done(ctx, ib, mc);
    }
}
