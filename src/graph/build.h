/* build.h: what the graph builders share (graph/encoder.c, graph/bert.c): appending row
 * ops and contractions, and exporting tensors under the names users read them by. */
#ifndef DM_GRAPH_BUILD_H
#define DM_GRAPH_BUILD_H

#include "graph/encoder.h"

/* A row op of `kind` over (numel(space) / cols, cols), in[nin] -> out[nout]; its id, or -1
 * (the status recorded). */
int dm_gb_pw(dm_graph *g, dm_op_kind kind, const char *name, int space, int64_t cols, const int *in, int nin,
             const int *out, int nout);
/* A contraction c = alpha * einsum(spec, a, b); its id or -1. */
int dm_gb_mm(dm_graph *g, const char *name, const char *spec, int a, int b, int c, float alpha);
/* Exports tensor `tensor` as `name` with the shape (s0[, s1[, s2]]) of ndim dimensions. */
void dm_gb_export(dm_encoder *e, const char *name, int tensor, int ndim, int64_t s0, int64_t s1, int64_t s2,
                  int is_param);
/* Exports each exported parameter's gradient as "<name>.grad" (after autodiff). */
dm_status dm_gb_export_param_grads(dm_graph *g, dm_encoder *enc);

#endif
