/* direct_avx2.c: the direct kernel (direct_avx512.c says what it copies and what it
 * reads in place) for CPUs with AVX2 and FMA but no AVX-512: 16 vector registers of 8
 * floats instead of 32 of 16.
 *   - Micro-tile 6 x 16: 12 accumulators, two vectors of op(B) and one broadcast of op(A)
 *     fill 15 of the 16 registers; 12 independent FMA chains cover the two FMA pipes'
 *     latency (4-5 cycles each) with room to spare.
 *   - op(B) is in the same 64-column panels as the AVX-512 kernel's (dm_direct_pack_b
 *     writes the same bytes on both), each panel four tiles wide.
 *   - op(A) NoTrans is read in place, as on AVX-512: for each strip of 6 rows, all the
 *     tiles of a block of op(B) in L2 (sized for the 512 KB L2 of Zen 2/3).
 *   - op(A) transposed (the weight gradients) is packed: read in place, each k of a strip
 *     is another row lda apart, and the strip was fetched again for every block of op(B)
 *     (55-70% of the FMA rate); packed once per slice of k into strips read in order, the
 *     same GEMMs run at 90-93%, level with OpenBLAS and BLIS (bench/kernels.sh).
 * tests/test_contract.c runs it (forced where the CPU has AVX-512) on the same shapes and
 * transposes as the AVX-512 kernel. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/direct_isa.h"

#define MR 6
#define NR 16 /* a tile's columns: two vectors */
#define PW 64 /* a panel's columns */
/* op(A) read in place: KC x NC blocks of op(B) (192 KB, in L2), each 6-row strip of op(A)
 * (9 KB) from L1 across a block's 8 tiles; KC = 384 writes C fewer times than 256 (BERT's
 * k = 768: twice, not 3 times); measured 4-8% faster than 256 x 256 on Zen 3 */
#define KC 384
/* k in (KC, 2 KC2] (the attention's P V and dS K at j = 512) as blocks of KC2: k = 512 as 2 x
 * 256, not 384 + 128, whose 384-row block of op(B) (96 KB at 64 columns) every strip read
 * from L2 and whose 128-row block wrote C once more: 57% of the FMA rate against 67-70%
 * (forced AVX2, 16 registers, Zen 4, 2 threads). A choice between two constants, not a
 * computed depth: with kc no longer bounded by a constant, gcc 12 spilled the tile's
 * accumulators in its inner loop (tests/check_spills.sh). */
#define KC2 256
#define NC 128
/* op(A) transposed: MCT x KCT blocks of it packed as strips (768 KB, in L3, read in
 * order), KCT x NCT blocks of op(B) (256 KB) */
#define KCT 256
#define NCT 256
#define MCT 768

/* packing A^T: the lines this many floats on are fetched ahead (no stride prefetcher
 * follows rows lda apart) */
#define PF_A 32
/* op(A) NoTrans is packed as A^T is where its rows lie a multiple of 4 KiB apart (lda a
 * multiple of 1024): a strip's 6 rows would share their L1 sets */
#define PACKN 1024

#if DM_GEMM_DIRECT_PACK_FLOATS < KC * NC || DM_GEMM_DIRECT_PACK_FLOATS < KCT * NCT + MCT * KCT + 8
#error "the direct kernel's buffer is smaller than a block of op(B) and one of op(A)"
#endif

#define AVX2_TARGET __attribute__((target("avx2,fma")))

/* the lanes of a tile's two vectors that hold its nr (1..16) columns */
static inline __attribute__((always_inline)) AVX2_TARGET void col_masks(int nr, __m256i *m0, __m256i *m1) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    *m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
    *m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane);
}

/* c[mr_c x nr] = alpha * sum_k a(r, k) b(k, 0..16) (+ c when acc); b is readable 16 wide */
static inline __attribute__((always_inline)) AVX2_TARGET void
tile(int mr_c, int kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs, float *c,
     int64_t ldc, int nr, int acc, float alpha) {
    __m256 s[MR][2];
    for (int r = 0; r < MR; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
    if (acc) /* C's tile is read at the end: from memory, while the sums run */
        for (int r = 0; r < MR; r++) {
            if (r >= mr_c) break;
            __builtin_prefetch(c + (int64_t)r * ldc, 1, 3);
            __builtin_prefetch(c + (int64_t)r * ldc + NR - 1, 1, 3);
        }
#pragma GCC unroll 4 /* 4-5% faster than not unrolled */
    for (int k = 0; k < kc; k++) {
        const float *bk = b + (int64_t)k * bs, *ak = a + (int64_t)k * acs;
        const __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
        for (int r = 0; r < MR; r++) {
            if (r >= mr_c) break;
            const __m256 av = _mm256_broadcast_ss(ak + (int64_t)r * ars);
            s[r][0] = _mm256_fmadd_ps(av, b0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(av, b1, s[r][1]);
        }
    }
    const __m256 al = _mm256_set1_ps(alpha);
    if (nr == NR) {
        for (int r = 0; r < MR; r++) {
            if (r >= mr_c) break;
            float *cr = c + (int64_t)r * ldc;
            __m256 x0 = _mm256_mul_ps(s[r][0], al), x1 = _mm256_mul_ps(s[r][1], al);
            if (acc) {
                x0 = _mm256_add_ps(x0, _mm256_loadu_ps(cr));
                x1 = _mm256_add_ps(x1, _mm256_loadu_ps(cr + 8));
            }
            _mm256_storeu_ps(cr, x0);
            _mm256_storeu_ps(cr + 8, x1);
        }
        return;
    }
    __m256i m0, m1;
    col_masks(nr, &m0, &m1);
    for (int r = 0; r < MR; r++) {
        if (r >= mr_c) break;
        float *cr = c + (int64_t)r * ldc;
        __m256 x0 = _mm256_mul_ps(s[r][0], al), x1 = _mm256_mul_ps(s[r][1], al);
        if (acc) {
            x0 = _mm256_add_ps(x0, _mm256_maskload_ps(cr, m0));
            x1 = _mm256_add_ps(x1, _mm256_maskload_ps(cr + 8, m1));
        }
        _mm256_maskstore_ps(cr, m0, x0);
        _mm256_maskstore_ps(cr + 8, m1, x1);
    }
}

/* the row count as a constant, so each variant keeps its accumulators in registers */
static AVX2_TARGET void tile_rows(int mr, int kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t bs,
                                  float *c, int64_t ldc, int nr, int acc, float alpha) {
    switch (mr) {
    case 6: tile(6, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    case 5: tile(5, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    case 4: tile(4, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    case 3: tile(3, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    case 2: tile(2, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    default: tile(1, kc, a, ars, acs, b, bs, c, ldc, nr, acc, alpha); break;
    }
}

/* 8 x 8 floats transposed in registers: r[c] becomes column c of the rows r[0..7] */
static inline __attribute__((always_inline)) AVX2_TARGET void transpose8_regs(__m256 r[8]) {
    __m256 t[8];
    for (int q = 0; q < 8; q += 2) { /* pairs of rows interleaved within 128-bit lanes */
        t[q] = _mm256_unpacklo_ps(r[q], r[q + 1]);
        t[q + 1] = _mm256_unpackhi_ps(r[q], r[q + 1]);
    }
    for (int q = 0; q < 8; q += 4) /* 4 x 4 blocks within lanes: columns c, c + 4 of rows q..q+3 */
        for (int h = 0; h < 2; h++) {
            r[q + 2 * h] = _mm256_shuffle_ps(t[q + h], t[q + 2 + h], 0x44);
            r[q + 2 * h + 1] = _mm256_shuffle_ps(t[q + h], t[q + 2 + h], 0xEE);
        }
    /* r[q], lane L: column (q & 3) + 4 L of rows q & 4 .. +3; the lane swaps join rows 0-3
     * and 4-7 */
    for (int q = 0; q < 4; q++) {
        t[q] = _mm256_permute2f128_ps(r[q], r[q + 4], 0x20);
        t[q + 4] = _mm256_permute2f128_ps(r[q], r[q + 4], 0x31);
    }
    for (int q = 0; q < 8; q++) r[q] = t[q];
}

/* 8 x 8 floats transposed: d[c * lds + r] = s[r * ls + c] */
static AVX2_TARGET void transpose8(float *d, int64_t lds, const float *s, int64_t ls) {
    __m256 r[8];
    for (int q = 0; q < 8; q++) r[q] = _mm256_loadu_ps(s + (int64_t)q * ls);
    transpose8_regs(r);
    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (int64_t)q * lds, r[q]);
}

void dm_direct_pack_b_avx2(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                           int j0, int nc) {
    dm_direct_pack_panels(buf, pstride, transB, B, ldb, k0, kc, j0, nc, 8, transpose8);
}

/* rows [0, mr) of op(A) (element (r, k) at a[r ars + k acs]), columns [0, kc), into d as
 * MR floats per k: a strip that a tile then reads as one stream, ars 1, acs MR */
static AVX2_TARGET void pack_a(float *d, const float *a, int64_t ars, int64_t acs, int mr, int kc) {
    if (ars == 1) { /* 8 floats stored per k, the 2 past the strip overwritten by the next k's */
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(mr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int k = 0; k < kc; k++) {
            __builtin_prefetch(a + (int64_t)k * acs + PF_A, 0, 2);
            _mm256_storeu_ps(d + (int64_t)k * MR, _mm256_maskload_ps(a + (int64_t)k * acs, mk));
        }
        return;
    }
    int k0 = 0; /* rows contiguous: 8 k at a time, transposed in registers */
    for (; mr == MR && k0 + 8 <= kc; k0 += 8) {
        __m256 r[8];
        for (int q = 0; q < MR; q++) r[q] = _mm256_loadu_ps(a + (int64_t)q * ars + k0);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8_regs(r);
        for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (int64_t)(k0 + q) * MR, r[q]);
    }
    for (int r = 0; r < mr; r++)
        for (int k = k0; k < kc; k++) d[(int64_t)k * MR + r] = a[(int64_t)r * ars + k];
}

/* rows [0, mc) of op(A) = A^T (element (r, k) at a[r + k acs]) as pack_a's strips (strip s
 * at d + s MR kc), KB rows of A (KB values of k) at a time across all the strips, as
 * direct_avx512.c's pack_at_rows: those rows stay in L1 while each strip takes its MR
 * columns of them (forced AVX2 on the Xeon, 1 thread: dV at j = 512 76 -> 85 GFLOP/s, at
 * j = 256 85 -> 92, ffn1 dW 92 -> 98) */
#define KB 16
static AVX2_TARGET void pack_at_rows(float *d, const float *a, int64_t acs, int mc, int kc) {
    const int ns = (mc + MR - 1) / MR;
    for (int kb = 0; kb < kc; kb += KB) {
        const int ke = kb + KB < kc ? kb + KB : kc;
        for (int q = 0; q < ns; q++) {
            const int mr = mc - q * MR < MR ? mc - q * MR : MR;
            const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(mr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            float *ds = d + (int64_t)q * MR * kc;
            for (int k = kb; k < ke; k++)
                _mm256_maskstore_ps(ds + (int64_t)k * MR, mk, _mm256_maskload_ps(a + (int64_t)k * acs + q * MR, mk));
        }
    }
}

/* tile jr's first column in a block of panels (row k of panel q at bp + q * pstride + k bs) */
static inline const float *tile_b(const float *bp, int64_t pstride, int jr) {
    return bp + (jr / PW) * pstride + jr % PW;
}

/* op(B)'s block [k0, k0 + kc) x [j0, j0 + nc) as the tiles read it: in place where
 * dm_direct_b_in_place says (contiguous rows, whole tiles, C short, a shallow block), else
 * packed into buf; *bs and *pstride say where row k of panel q is */
static AVX2_TARGET const float *b_block(float *buf, int transB, const float *B, int ldb, int m, int k0, int kc, int j0,
                                        int nc, int64_t *bs, int64_t *pstride) {
    if (dm_direct_b_in_place(0, transB, m, nc, kc, NR)) {
        *bs = ldb, *pstride = PW;
        return B + (int64_t)k0 * ldb + j0;
    }
    *bs = PW, *pstride = (int64_t)kc * PW;
    dm_direct_pack_b_avx2(buf, *pstride, transB, B, ldb, k0, kc, j0, nc);
    return buf;
}

/* strips [i0, i0 + mc) of op(A) at a (element (r, k) at a[r ars + k acs]) by the block of
 * op(B) at bp, into C's columns [j0, j0 + nc); a packed strip has ars 1, acs MR and the
 * next strip sstride floats on */
static AVX2_TARGET void strips(int mc, int kc, int nc, const float *a, int64_t ars, int64_t acs, int64_t sstride,
                               const float *bp, int64_t bs, int64_t pstride, float *c, int ldc, int acc, float alpha) {
    for (int i0 = 0; i0 < mc; i0 += MR) {
        const int mr = mc - i0 < MR ? mc - i0 : MR;
        const float *as = a + (int64_t)(i0 / MR) * sstride;
        for (int jr = 0; jr < nc; jr += NR)
            tile_rows(mr, kc, as, ars, acs, tile_b(bp, pstride, jr), bs, c + (int64_t)i0 * ldc + jr, ldc,
                      nc - jr < NR ? nc - jr : NR, acc, alpha);
    }
}

AVX2_TARGET void dm_sgemm_direct_avx2(int transA, int transB, int m, int n, int k, float alpha, const float *A,
                                      int lda, const float *B, int ldb, float *C, int ldc, float *buf) {
    if (k <= 0) {
        for (int i = 0; i < m; i++) memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    int64_t bs, pstride;
    if (!transA && lda % PACKN) { /* op(A)'s rows contiguous: read in place, each strip from L1 across a block's tiles */
        const int kstep = k > KC && k <= 2 * KC2 ? KC2 : KC;
        for (int j0 = 0; j0 < n; j0 += NC) {
            const int nc = n - j0 < NC ? n - j0 : NC;
            for (int k0 = 0; k0 < k; k0 += kstep) {
                const int kc = k - k0 < kstep ? k - k0 : kstep;
                const float *bp = b_block(buf, transB, B, ldb, m, k0, kc, j0, nc, &bs, &pstride);
                strips(m, kc, nc, A + k0, lda, 1, (int64_t)MR * lda, bp, bs, pstride, C + j0, ldc, k0 > 0, alpha);
            }
        }
        return;
    }
    /* op(A) = A^T, its rows strided (or rows 4 KiB apart): blocks of MCT rows packed as
     * strips once per KCT deep slice (MCT x KCT floats, from L3 in order), then the
     * columns in blocks of NCT */
    float *ap = buf + (int64_t)KCT * NCT;
    for (int k0 = 0; k0 < k; k0 += KCT) {
        const int kc = k - k0 < KCT ? k - k0 : KCT;
        for (int ib = 0; ib < m; ib += MCT) {
            const int mc = m - ib < MCT ? m - ib : MCT;
            if (transA)
                pack_at_rows(ap, A + (int64_t)k0 * lda + ib, lda, mc, kc);
            else
                for (int i0 = 0; i0 < mc; i0 += MR)
                    pack_a(ap + (int64_t)(i0 / MR) * MR * kc, A + (int64_t)(ib + i0) * lda + k0, lda, 1,
                           mc - i0 < MR ? mc - i0 : MR, kc);
            for (int j0 = 0; j0 < n; j0 += NCT) {
                const int nc = n - j0 < NCT ? n - j0 : NCT;
                const float *bp = b_block(buf, transB, B, ldb, DM_DIRECT_PANEL_M, k0, kc, j0, nc, &bs, &pstride);
                strips(mc, kc, nc, ap, 1, MR, (int64_t)MR * kc, bp, bs, pstride, C + (int64_t)ib * ldc + j0, ldc,
                       k0 > 0, alpha);
            }
        }
    }
}

/* Row blocks of MC rows (4 strips, which share each KC x 16 tile of op(B), 16 KB, from
 * L1), finished over all of n and k and handed to done() while in cache, as in
 * direct_avx512.c. */
#define MC (4 * MR)

AVX2_TARGET void dm_sgemm_direct_rows_avx2(int transA, int m, int n, int k, float alpha, const float *A, int lda,
                                           const float *Bp, int64_t ldbp, int64_t pstride, float *C, int ldc,
                                           void (*done)(void *ctx, int i0, int rows), void *ctx) {
    const int64_t ars = transA ? 1 : lda, acs = transA ? lda : 1;
    static _Thread_local float ablk[MC * KC + 8] __attribute__((aligned(64))); /* the block's strips, packed */
    for (int ib = 0; ib < m; ib += MC) {
        const int mc = m - ib < MC ? m - ib : MC;
        if (k <= 0)
            for (int i = ib; i < ib + mc; i++) memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)n);
        for (int k0 = 0; k0 < k; k0 += KC) {
            const int kc = k - k0 < KC ? k - k0 : KC;
            if (transA)
                for (int i0 = ib; i0 < ib + mc; i0 += MR)
                    pack_a(ablk + (i0 - ib) * KC, A + (int64_t)i0 * ars + (int64_t)k0 * acs, ars, acs,
                           ib + mc - i0 < MR ? ib + mc - i0 : MR, kc);
            for (int jr = 0; jr < n; jr += NR)
                for (int i0 = ib; i0 < ib + mc; i0 += MR) {
                    const int mr = ib + mc - i0 < MR ? ib + mc - i0 : MR;
                    const int packed = transA;
                    tile_rows(mr, kc, packed ? ablk + (i0 - ib) * KC : A + (int64_t)i0 * ars + (int64_t)k0 * acs,
                              packed ? 1 : ars, packed ? MR : acs, tile_b(Bp + (int64_t)k0 * ldbp, pstride, jr), ldbp,
                              C + (int64_t)i0 * ldc + jr, ldc, n - jr < NR ? n - jr : NR, k0 > 0, alpha);
                }
        }
        done(ctx, ib, mc);
    }
}
