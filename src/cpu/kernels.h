/* kernels.h: CPU kernel families. Element-wise and normalization kernels work on one
 * row of their group's iteration space (rows x cols); the group executor (exec.c) calls
 * them row by row so a fused group's intermediates stay in cache-resident scratch rows.
 * Each fast kernel has a naive whole-tensor reference (ref.c) for the tests. */
#ifndef DM_CPU_KERNELS_H
#define DM_CPU_KERNELS_H

#include <stdint.h>

#include "graph/graph.h"

/* How a row kernel's operands are addressed (dm_arg_kind, dm_arg_in / dm_arg_out): the
 * operator table's, graph/ops.h. */

typedef struct {
    const dm_op *op;
    int64_t r, cols;
    int64_t key;     /* the row's index for its Philox keys: r, or in an unpadded layer the
                      * padded layer's row of this token's (whoever makes a dm_row sets it) */
    const float *in[DM_MAX_IN];
    float *out[DM_MAX_OUT]; /* FULL: the row; ROWSCALAR: one float; COLACC: accumulators */
    uint64_t seed;
    uint32_t *words; /* scratch for cols random words */
} dm_row;

void dm_cpu_row(const dm_row *rw);

/* Naive references over whole tensors (ref.c), same operand conventions, in double;
 * mask_groups: rows of the GROUPED operand of MASK_ADD, or ATTN's sequences (b).
 * LINEAR_XENT and its backward (rows m, cols v) take e, the columns of t and W, from
 * op->nindex; ATTN and its backward (rows b h j, cols j) the head size p. */
void dm_ref_op(const dm_op *op, uint64_t seed, int64_t mask_groups, const float *const *in,
               float *const *out);

/* The fused decoder and cross-entropy (xent.c; ops.def's LINEAR_XENT, LINEAR_XENT_BWD):
 * t (m, e), W (v, e), bias (v), labels (m) in; forward loss, lse, pred (m); backward from
 * lse and dloss (m): dt (m, e), dW (v, e), dbias (v). work: dm_cpu_xent_work_floats(bwd,
 * m, e, nthreads) floats. Sizes below 2^31 (BLAS's ints), m * chunk and m * e included. */
#ifndef DM_XENT_CHUNK
/* vocabulary columns per chunk (BERT-base's head on a 2-core EPYC: 256 was about 10%
 * slower at m = 820, the same at m = 205) */
#define DM_XENT_CHUNK 512
#endif
int64_t dm_cpu_xent_work_floats(int bwd, int64_t m, int64_t e, int nthreads);
void dm_cpu_linear_xent(const float *t, const float *W, const float *bias, const float *labels, int64_t m,
                        int64_t e, int64_t v, float *loss, float *lse, float *pred, float *work, int nthreads);
void dm_cpu_linear_xent_bwd(const float *t, const float *W, const float *bias, const float *labels,
                            const float *lse, const float *dloss, int64_t m, int64_t e, int64_t v, float *dt,
                            float *dW, float *dbias, float *work, int nthreads);

#endif
