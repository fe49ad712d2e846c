/* rewrite.h: graph rewrites the fused schedule applies before planning (rewrite.c). Each
 * keeps op and tensor ids and op names (new tensors are appended), so a fused graph's ops
 * line up with the unfused graph's. *count (may be NULL): how many sites were rewritten. */
#ifndef DM_GRAPH_REWRITE_H
#define DM_GRAPH_REWRITE_H

#include "graph/graph.h"

/* Every activation y = act(x) whose backward dx = dy * act'(x) the graph also holds becomes
 * ACT_DERIV (y and d = act'(x) from one evaluation, sharing its exp) and the backward
 * becomes MUL (dx = dy * d): the backward keeps d instead of x. */
dm_status dm_rewrite_act_deriv(dm_graph *g, int *count);

/* A dropout backward (p > 0) whose result only softmax backwards read, each multiplying it
 * by the dropout's input y elementwise, becomes DROPOUT_BWD_NZ: it reads the mask off the
 * forward output (kept where it is non-zero) instead of regenerating random numbers.
 * Where that output is zero but the element was kept, y is zero, and so is what the
 * softmax backward makes of it. */
dm_status dm_rewrite_dropout_bwd_nz(dm_graph *g, int *count);

/* All of the above, for the fused schedule. */
dm_status dm_rewrite_fused(dm_graph *g);

/* Attention recomputed in the backward pass (dm_layer_options.recompute): the chain
 * scores = Q K^T, mask, softmax, dropout is cloned into the backward pass right before
 * its first backward reader, and the backward reads the clones' probabilities instead of
 * the forward's, which then never leave the forward's group. The same arithmetic and the
 * same dropout masks (Philox by element index): the same numbers wherever the clone's
 * Q K^T runs the same GEMM kernel as the forward's (default plans; a tuned plan may give
 * them different algorithms, and rounding then differs in the last bits). This one
 * inserts ops (the backward's op ids shift; names stay). */
dm_status dm_rewrite_recompute_attention(dm_graph *g, int *count);

#endif
