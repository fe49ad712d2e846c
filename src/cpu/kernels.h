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
    const float *in[DM_MAX_IN];
    float *out[DM_MAX_OUT]; /* FULL: the row; ROWSCALAR: one float; COLACC: accumulators */
    uint64_t seed;
    uint32_t *words; /* scratch for cols random words */
} dm_row;

void dm_cpu_row(const dm_row *rw);

/* Naive references over whole tensors (ref.c), same operand conventions, in double;
 * mask_groups: rows of the GROUPED operand of MASK_ADD. */
void dm_ref_op(const dm_op *op, uint64_t seed, int64_t mask_groups, const float *const *in,
               float *const *out);

#endif
