/* contract.h: a contraction (einsum of two operands) run on the CPU: its GEMM mapping
 * (plan/gemm.h) as BLAS sgemm calls or dmove's own kernel, and how threads share them. */
#ifndef DM_CPU_CONTRACT_H
#define DM_CPU_CONTRACT_H

#include <stdint.h>

#include "graph/graph.h"
#include "plan/algo.h"
#include "plan/gemm.h"

/* How the threads share one contraction (the tuner's implementation choice):
 *   BLAS   one sgemm per batch index, the BLAS's own threads inside each call
 *   BATCH  OpenMP over the batch indices, single-threaded sgemm inside (needs nbatch > 1)
 *   SPLIT_M / SPLIT_N  OpenMP threads each take a contiguous block of the rows (m) or
 *          columns (n) of every call, single-threaded sgemm on their block
 *   CONCURRENT  runs at the same time as a later, independent weight-gradient
 *          contraction of the same pass (dm_plan_partner), each on half the threads,
 *          split over its rows: two GEMMs side by side instead of one after the other,
 *          each on its own cores (the CPU's counterpart of a second CUDA stream); the
 *          executor pairs them, dm_gemm_run alone runs it like BLAS
 *   DIRECT dmove's own kernel (direct.c: AVX-512 or AVX2), which reads the operands in place
 *          instead of packing them: OpenMP over the batch where it has at least as many
 *          indices as threads, else each thread a block of the longer side (m or n);
 *          inside a fused (batched) group, the kernel of each batch index's call
 *   DIRECT_ROWS  the direct kernel, each thread on a block of the rows, with the next
 *          group (a row group) run on each block of rows as soon as the kernel has
 *          finished it, while it is in cache (the executor's exec_fused_rows); alone,
 *          dm_gemm_run runs it like DIRECT
 *   CONCURRENT_DIRECT  CONCURRENT with the direct kernel for this contraction's share
 * DEFAULT (an untuned plan) is the rule dm_gemm_default_algo writes down, from
 * bench/kernels.sh's table (bench/results/kernels-*.txt): batched contractions (the
 * attention's per-item GEMMs, alone or inside a fused group) run DIRECT where the direct
 * kernel runs, BATCH elsewhere: on BERT-base's 128 x 128 x 64 items it ran 1.1-1.3x
 * OpenBLAS's single-threaded calls and up to 1.9x BLIS's, on BERT-large's 512 x 512 x 64
 * ones 1.0-1.2x (AVX2, 1 and 2 threads); on AVX-512 the tuner chose it there too. Lone
 * contractions run DIRECT too where the kernel runs, else BLAS: on BERT's large GEMMs alone
 * the kernel is level with OpenBLAS and BLIS (within 3% either way, 1 and 2 threads), but
 * in a step it writes C once, where OpenBLAS first scales C by beta (0: a pass that writes
 * it whole) and then reads it back (5% of a small BERT's pretraining step in perf); the
 * layer's step measured, interleaved (2-core EPYC, AVX2, 2 threads, 4 rounds): the i=256
 * u=1024 layer at b=16 65-72 ms against 75-81 with BLAS; BERT-base b=8 255-272 against
 * 256-309, no clear change (bench/results/lone-direct-2026-11-27.txt). A plan's
 * contraction left at DEFAULT takes this rule (DM_PLAN_VERSION 2). The tuner still times BLAS, the
 * thread splits and DIRECT_ROWS against it per contraction. */
typedef enum {
    DM_GEMM_DEFAULT = 0,
    DM_GEMM_BLAS,
    DM_GEMM_BATCH,
    DM_GEMM_SPLIT_M,
    DM_GEMM_SPLIT_N,
    DM_GEMM_CONCURRENT,
    DM_GEMM_DIRECT,
    DM_GEMM_DIRECT_ROWS,
    DM_GEMM_CONCURRENT_DIRECT,
    DM_GEMM_NUM_ALGOS
} dm_gemm_algo;

/* the algorithms whose kernel is the direct one */
static inline int dm_gemm_algo_direct(int a) {
    return a == DM_GEMM_DIRECT || a == DM_GEMM_DIRECT_ROWS || a == DM_GEMM_CONCURRENT_DIRECT;
}
/* the algorithms that run a partner contraction beside this one */
static inline int dm_gemm_algo_concurrent(int a) { return a == DM_GEMM_CONCURRENT || a == DM_GEMM_CONCURRENT_DIRECT; }

/* The table that names them for the planner and plan files (plan/algo.h): backend "cpu",
 * ids the dm_gemm_algo values; CONCURRENT and CONCURRENT_DIRECT are DM_ALGO_BESIDE,
 * DIRECT_ROWS is DM_ALGO_ROWS_EPILOGUE. */
extern const dm_algo_table dm_cpu_gemm_algos;

const char *dm_gemm_algo_name(dm_gemm_algo a);
/* -1 if unknown */
int dm_gemm_algo_parse(const char *s);

/* A contraction as the CPU runs it: its GEMM mapping (plan/gemm.h; the fields also by
 * name, gm->m, gm->lda, ...) and how the threads share it. */
typedef struct {
    union {
        dm_gemm_map map;
        struct {
            DM_GEMM_MAP_FIELDS
        };
    };
    dm_gemm_algo algo;  /* never DEFAULT after prepare */
    int nthreads;       /* threads for BATCH / SPLIT_* (0: OpenMP's default) */
    float *pack;        /* DIRECT: pack_threads buffers of DM_GEMM_DIRECT_PACK_FLOATS, one per
                         * OpenMP thread number (NULL: dm_gemm_run and dm_gemm_run_pair
                         * allocate them per call) */
    int pack_threads;
    int whole_m, whole_n; /* a part's (contract.c: a thread's share of C): the whole GEMM's m
                           * and n, which choose the kernel's variant; 0: this GEMM's own */
} dm_gemm;

/* floats of the direct kernel's per-thread buffer for its packed operands (1 MiB and a
 * little: direct_avx2.c's blocks of both operands for a transposed op(A)) */
#define DM_GEMM_DIRECT_PACK_FLOATS (256 * 1024 + 64)
/* dm_sgemm_direct packs op(B) rows it could read in place into panels all the same from
 * this many rows of C on: the copy is then small beside the work, and the panels'
 * consecutive addresses help (small layer, 2 threads: GEMMs of 2048 rows each 7-10%
 * faster; 512 rows with k = 4096 9% slower packed; the attention's 128-row items 2-3%
 * slower packed) */
#define DM_DIRECT_PANEL_M 1024

/* The direct kernel with a row epilogue (algorithm DIRECT_ROWS, run by the executor):
 * C = alpha op(A) Bp, where Bp is op(B) whole: row k of its 64-column panel q at
 * Bp + k * ldbp + q * pstride (in place: ldbp = ldb, pstride = 64; packed by
 * dm_direct_pack_b: ldbp = 64, pstride = 64 k), each row readable to n rounded up to 64
 * (zero padding, or more of a matrix); done(ctx, i0, rows) is called for each block of
 * rows as soon as they are final, in order. Single-threaded. */
void dm_sgemm_direct_rows(int transA, int m, int n, int k, float alpha, const float *A, int lda, const float *Bp,
                          int64_t ldbp, int64_t pstride, float *C, int ldc, void (*done)(void *ctx, int i0, int rows),
                          void *ctx);
/* Rows [k0, k0 + kc) and columns [j0, j0 + nc) of op(B) (B transposed when transB) into
 * buf as 64-column panels: row kk of panel q at buf + q * pstride + kk * 64, the
 * columns past nc zeroed. */
void dm_direct_pack_b(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc, int j0,
                      int nc);

/* How often a direct algorithm's call ran BLAS instead, for want of a buffer for its
 * thread (a guard that should never fire: the tests check it stays 0). */
long dm_gemm_direct_fallbacks(void);

/* The instruction sets the direct kernel has a variant for (direct.c). */
enum { DM_ISA_NONE = 0, DM_ISA_AVX2 = 1, DM_ISA_AVX512 = 2, DM_ISA_AMX = 3 };
/* the widest this CPU has (cpuid: AMX's tiles and bf16 with AVX-512 BF16, which the
 * kernel (Linux) lets this process use; AVX-512F; AVX2 with FMA; else none). "amx" runs
 * the AVX-512 variant wherever the AMX one does not (direct_isa.h: dm_direct_amx_takes). */
int dm_cpu_isa_widest(void);
/* the variant in use: the widest, narrowed by DMOVE_ISA=avx512|avx2|none in the environment
 * (read at the first call) or by dm_gemm_direct_set_isa */
int dm_gemm_direct_isa(void);
/* narrows (or widens back up to the widest) the variant in use, for tests and timing;
 * not while a direct kernel runs. DM_ERR_UNSUPPORTED above the CPU's widest. */
dm_status dm_gemm_direct_set_isa(int isa);
const char *dm_isa_name(int isa); /* "amx", "avx512", "avx2", "none" */
int dm_isa_parse(const char *s);  /* -1 if unknown */
/* 1 if the direct kernel runs here (a variant is in use) */
int dm_gemm_direct_available(void);
/* C = alpha op(A) op(B), single-threaded, row-major; buf: DM_GEMM_DIRECT_PACK_FLOATS
 * floats, 64-byte aligned. Only where dm_gemm_direct_available(). */
void dm_sgemm_direct(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                     const float *B, int ldb, float *C, int ldc, float *buf);
/* dm_sgemm_direct on a part (a thread's rows or columns) of a GEMM whose C is whole_m x
 * whole_n: the variant is the one the whole GEMM gets (direct_isa.h: dm_direct_amx_takes),
 * so a split of C between threads changes no result */
void dm_sgemm_direct_part(int whole_m, int whole_n, int transA, int transB, int m, int n, int k, float alpha,
                          const float *A, int lda, const float *B, int ldb, float *C, int ldc, float *buf);
/* dm_sgemm_direct on the vector units alone (AVX-512 or AVX2, never AMX): the arithmetic of
 * dm_sgemm_direct_rows, which algorithm "direct_rows" keeps wherever it runs, fused with its
 * row group or not */
void dm_sgemm_direct_vec(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, float *buf);

/* Maps op (a DM_OP_CONTRACT) with operands at A, B, C (laid out as their tensors say)
 * to BLAS calls (dm_gemm_map_prepare), algorithm DEFAULT. DM_ERR_UNSUPPORTED if a layout
 * needs a copy. */
dm_status dm_gemm_prepare(dm_gemm *gm, const dm_graph *g, const dm_op *op, float *A, float *B,
                          float *C);
dm_status dm_gemm_run(const dm_gemm *gm);
/* a and b at the same time: nthreads (0: OpenMP's default) split in two teams, a on the
 * first half (rounded down, at least one), b on the rest; each team splits its GEMM's
 * longer side (m or n) in blocks, one single-threaded call per thread and batch index.
 * With one thread, a then b. The caller guarantees they are independent. */
dm_status dm_gemm_run_pair(const dm_gemm *a, const dm_gemm *b, int nthreads);
/* Sets the algorithm (DEFAULT picks as above); DM_ERR_UNSUPPORTED if it does not apply
 * (BATCH without a batch, DIRECT on a CPU with neither AVX-512 nor AVX2). */
dm_status dm_gemm_set_algo(dm_gemm *gm, dm_gemm_algo algo, int nthreads);
/* what DEFAULT is for a contraction of nbatch GEMM calls (the rule above the enum) */
dm_gemm_algo dm_gemm_default_algo(int64_t nbatch);
/* Asks for batch index bi's slices of A and B (those not in tiles: tileA / tileB 0) to be
 * brought into L2, while the caller works on another index. */
void dm_gemm_prefetch(const dm_gemm *gm, int64_t bi, int tileA, int tileB);
/* One batch index, single-threaded; a non-NULL tile replaces that operand (original
 * order: the spec's first input, second input, output) for this index, without batch
 * offset. DIRECT needs gm->pack with a buffer for this OpenMP thread number. */
void dm_gemm_run_one(const dm_gemm *gm, int64_t bi, float *tileA, float *tileB, float *tileC);

#endif
