/* gemm.h: a contraction (einsum of two operands) mapped to GEMM calls: which letters are
 * looped over as a batch, the M, N and K of each call, the transposes and leading
 * dimensions the operands' strides imply (row-major), and whether A and B were exchanged
 * to give C a unit stride. Every backend runs a contraction from this mapping (the CPU
 * through BLAS or its own kernel, CUDA through cuBLAS); gemm.c makes it. */
#ifndef DM_GEMM_H
#define DM_GEMM_H

#include <stdint.h>

#include "graph/graph.h"

/* The fields of the mapping, a list so that a backend's own call struct can hold them by
 * name beside its choices (cpu/contract.h's dm_gemm). */
#define DM_GEMM_MAP_FIELDS                                                                   \
    float *A, *B, *C;   /* after any swap: C = alpha * op(A) op(B) + beta * C */              \
    int transA, transB; /* 0 NoTrans, 1 Trans (row-major) */                                 \
    int m, n, k, lda, ldb, ldc;                                                              \
    float alpha, beta;                                                                       \
    int nbd;            /* batch dimensions looped over */                                   \
    int64_t bsize[DM_MAX_DIMS], bsA[DM_MAX_DIMS], bsB[DM_MAX_DIMS], bsC[DM_MAX_DIMS];       \
    int64_t nbatch;                                                                          \
    int swapped;        /* A and B were exchanged (C^T = B^T A^T) */

typedef struct {
    DM_GEMM_MAP_FIELDS
} dm_gemm_map;

/* Maps op (a DM_OP_CONTRACT) with operands at A, B, C (laid out as their tensors say; only
 * pointer arithmetic is done on them, so device addresses serve) to GEMM calls.
 * DM_ERR_UNSUPPORTED if a layout needs a copy or a size exceeds the int range of BLAS. */
dm_status dm_gemm_map_prepare(dm_gemm_map *gm, const dm_graph *g, const dm_op *op, float *A, float *B,
                              float *C);
/* Reference: the same contraction by loops in double, without the mapping (for the
 * tests). */
void dm_gemm_ref(const dm_graph *g, const dm_op *op, const float *A, const float *B, float *C);

#endif
