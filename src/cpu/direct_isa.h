/* direct_isa.h: the direct kernel's variants, one per instruction set (direct_avx512.c,
 * direct_avx2.c), behind contract.h's dm_sgemm_direct, dm_sgemm_direct_rows and
 * dm_direct_pack_b, which direct.c points at the widest one this CPU runs. Each has the
 * contract of the function it stands for and the same panel format (64-column panels of
 * op(B)), so a buffer packed by one is read by the other. */
#ifndef DM_CPU_DIRECT_ISA_H
#define DM_CPU_DIRECT_ISA_H

#include "cpu/contract.h"

/* d[c * lds + r] = s[r * ls + c] for a block of tb x tb floats (tb the variant's width) */
typedef void (*dm_direct_transpose_fn)(float *d, int64_t lds, const float *s, int64_t ls);
/* dm_direct_pack_b's loop, the one both variants run, with their own block transpose:
 * the panels' rows copied (NoTrans) or transposed tb x tb at a time and by element at
 * the edges, the columns past nc zeroed */
void dm_direct_pack_panels(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                           int j0, int nc, int tb, dm_direct_transpose_fn transpose);

/* Whether the tiles read a block of op(B) (kc rows, nc columns) in place, else packed into
 * panels: where its rows are contiguous (NoTrans), whole tiles wide (nc a multiple of the
 * variant's tile), C short (DM_DIRECT_PANEL_M), and the block shallow: kc at most
 * DM_DIRECT_INPLACE_K rows, or op(A) transposed. Deeper blocks read in place lose L1 to
 * their rows' stride (the attention's P V and dS K, rows 3i floats apart, 2 threads on Zen 4
 * AVX-512: j = 512, i = 1024: 65% of the FMA rate in place, 80-82% packed; j = 256, 62-72%
 * against 80-84%; j = 128, kc 128: the same either way). With op(A) transposed (dV = P^T
 * dO, dK = dS^T Q), whose strips already miss L1, the packed panel measured slower (in place
 * 71%, packed 52%; the AVX2 variant packs every block of a transposed op(A) anyway). */
#define DM_DIRECT_INPLACE_K 128
static inline int dm_direct_b_in_place(int transA, int transB, int m, int nc, int kc, int tile) {
    return !transB && nc % tile == 0 && m < DM_DIRECT_PANEL_M && (transA || kc <= DM_DIRECT_INPLACE_K);
}

/* Whether the AVX-512 variant packs a transposed op(A) into strips wherever a strip would
 * be read for two blocks of op(B) or more (n > NC), else only for more than two (n > 2 NC);
 * the summation order is the same either way, so are the results. In place, each k of a
 * strip is a row lda apart. Measured with bench/kernels.sh, 2 threads, % of the probed FMA
 * rate, in place against packed, ffn1 and qkv dW (n 768): on Zen 4 (AMD, 2026-11-28)
 * 92-94% against 86-89%; on an Intel Xeon with AMX (2026-11-28, two 512-bit FMA units)
 * 58-66% against 66-71% (MKL: 69%). A single block (the attention's dV and dK, n 64)
 * stays in place on both where it is at most KC deep: at j = 128 packed fell from 58% to
 * 42% on the Xeon; deeper (j = 512, BERT-large's dV = P^T dO), each k of a strip another row
 * 2 KB on, the rows fall into two L1 sets and packing wins: 61-63 GFLOP/s to 93-97 on 1
 * thread, 125-137 to 191-202 on 2 (j = 256, 256 deep, the same either way). Rule: the first
 * on AMD, the second elsewhere; DMOVE_PACK_AT=0 or 1 says which (tests run both). */
int dm_direct_pack_at_always(void);
void dm_direct_set_pack_at(int v); /* 0, 1; -1: as the CPU and DMOVE_PACK_AT say (tests) */

void dm_sgemm_direct_avx512(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                            const float *B, int ldb, float *C, int ldc, float *buf);
void dm_sgemm_direct_rows_avx512(int transA, int m, int n, int k, float alpha, const float *A, int lda,
                                 const float *Bp, int64_t ldbp, int64_t pstride, float *C, int ldc,
                                 void (*done)(void *ctx, int i0, int rows), void *ctx);
void dm_direct_pack_b_avx512(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                             int j0, int nc);

/* The AMX variant (direct_amx.c: fp32 as three bf16 parts, six products, fp32 sums) takes
 * the GEMMs whose C is at least DM_DIRECT_AMX_MIN_M x DM_DIRECT_AMX_MIN_N and whose k is at
 * least DM_DIRECT_AMX_MIN_K, and the narrower ones below; the rest run on the AVX-512
 * variant. Its cost beside the products is packing both operands as three parts, which few
 * columns or rows do not pay back, and the AVX-512 variant's 64-column tile fits the
 * attention's n = 64 (P V, dQ, dK, dV) exactly. Measured on the Xeon (2026-11-29,
 * 1 thread, 16 GEMMs in turn, operands out of cache), AMX against AVX-512: 512 x 512 x 64
 * (Q K^T, dP) 1.60x, 128 x 128 x 64 1.22x, 128 x 128 x 32 1.21x, 96 x 96 x 96 1.46x, 768 x
 * 768 x 32 1.34x, 768 x 96 x 768 1.70x (op(A) transposed 1.38x), 32 x 768 x 768 1.34x, 8 x
 * 768 x 768 1.22x but 16 x 3072 x 768 0.84x and 1 x 768 x 768 0.70x; 768 x 768 x 16 0.97x;
 * n = 64: 512 x 64 x 512 1.09x, op(A) transposed 0.95x, 1024 x 64 x 1024 transposed 0.76x,
 * 128 x 64 x 128 0.58-0.76x, 64 x 64 x 64 0.86x. Narrower C (n < DM_DIRECT_AMX_MIN_N) goes
 * to AMX where it is at least DM_DIRECT_AMX_NARROW_N wide and both m and k are at least
 * DM_DIRECT_AMX_NARROW_MK: once the operands stored by k rows were read in their order
 * (direct_amx.c's pack_tiles), the attention's four n = 64 GEMMs inside the one-op attention
 * (src/cpu/attn.c, operands 3i floats apart, 2 threads, cycles of each GEMM over 12 steps)
 * took AMX / AVX-512: j = 512 (BERT-large): P V 0.71-0.78, dV 0.75-0.84, dQ 0.71-0.79, dK
 * 0.72-0.79; j = 256: 0.87-0.91, 0.81-0.83, 0.81-0.88, 0.88-0.89; but j = 128 (BERT-base):
 * 1.19-1.21, 1.33-1.35, 1.23-1.30, 1.33-1.34 (1 thread, out of cache: 512 x 64 x 512 1.18x,
 * transposed 1.06x; 256 x 64 x 256 0.97x; 128 x 64 x 128 0.82x). The rule reads the whole
 * GEMM's shape (dm_sgemm_direct_part: a thread's share of C keeps it), so a thread count
 * changes no result. */
#define DM_DIRECT_AMX_MIN_M 32
#define DM_DIRECT_AMX_MIN_N 96
#define DM_DIRECT_AMX_MIN_K 32
#define DM_DIRECT_AMX_NARROW_N 64
#define DM_DIRECT_AMX_NARROW_MK 256
static inline int dm_direct_amx_takes(int m, int n, int k) {
    return m >= DM_DIRECT_AMX_MIN_M && k >= DM_DIRECT_AMX_MIN_K &&
           (n >= DM_DIRECT_AMX_MIN_N ||
            (n >= DM_DIRECT_AMX_NARROW_N && m >= DM_DIRECT_AMX_NARROW_MK && k >= DM_DIRECT_AMX_NARROW_MK));
}
void dm_sgemm_direct_amx(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, float *buf);

void dm_sgemm_direct_avx2(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                          const float *B, int ldb, float *C, int ldc, float *buf);
void dm_sgemm_direct_rows_avx2(int transA, int m, int n, int k, float alpha, const float *A, int lda,
                               const float *Bp, int64_t ldbp, int64_t pstride, float *C, int ldc,
                               void (*done)(void *ctx, int i0, int rows), void *ctx);
void dm_direct_pack_b_avx2(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                           int j0, int nc);

#endif
