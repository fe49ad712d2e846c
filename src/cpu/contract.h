/* contract.h: a contraction (einsum of two operands) mapped to BLAS sgemm calls. */
#ifndef DM_CPU_CONTRACT_H
#define DM_CPU_CONTRACT_H

#include <stdint.h>

#include "graph/graph.h"

typedef struct {
    float *A, *B, *C;   /* after any swap: C = alpha * op(A) op(B) + beta * C */
    int transA, transB; /* 0 NoTrans, 1 Trans (row-major) */
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    int nbd;            /* batch dimensions looped over */
    int64_t bsize[DM_MAX_DIMS], bsA[DM_MAX_DIMS], bsB[DM_MAX_DIMS], bsC[DM_MAX_DIMS];
    int64_t nbatch;
    int parallel_batch; /* OpenMP over the batch, single-threaded BLAS inside */
    int swapped;        /* A and B were exchanged (C^T = B^T A^T) */
} dm_gemm;

/* Maps op (a DM_OP_CONTRACT) with operands at A, B, C (laid out as their tensors say)
 * to BLAS calls. DM_ERR_UNSUPPORTED if a layout needs a copy. */
dm_status dm_gemm_prepare(dm_gemm *gm, const dm_graph *g, const dm_op *op, float *A, float *B,
                          float *C);
dm_status dm_gemm_run(const dm_gemm *gm);
/* One batch index; a non-NULL tile replaces that operand (original order: the spec's
 * first input, second input, output) for this index, without batch offset. */
void dm_gemm_run_one(const dm_gemm *gm, int64_t bi, float *tileA, float *tileB, float *tileC);
/* Reference: the same contraction by loops in double (for the tests). */
void dm_gemm_ref(const dm_graph *g, const dm_op *op, const float *A, const float *B, float *C);

#endif
