/* live.h: how a plan's groups follow its live rows (graph.h's `live`: the batch's real
 * tokens of an unpadded layer, the MLM head's scored positions), for every backend's
 * set_rows: a row group runs on as many rows as the step has (times its rows per live
 * row), a contraction with the m, n or k that counts them cut, and the layer's outputs
 * are zeroed past them. Which dimension counts the rows is read off the mapping
 * (gemm.h) made again on copies of the graph with the live rows as one letter of two
 * sizes: the dimension that changes is the one that counts them. */
#ifndef DM_PLAN_LIVE_H
#define DM_PLAN_LIVE_H

#include <stdint.h>

#include "plan/gemm.h"
#include "plan/plan.h"

enum { DM_LIVE_MAX_OUT = 4 };

typedef struct {
    const dm_plan *plan;
    int64_t cap;   /* the live rows at full size (0: the plan has none) */
    int attn;      /* the plan has ATTN or ATTN_BWD (an unpadded layer: the cut is not optional) */
    dm_graph g1, g2; /* the graph with cap and cap - 1 live rows (their tensors own copies) */
} dm_live;

/* How group gi follows the live rows. */
typedef struct {
    int64_t tok_mnk[3]; /* a contraction: m, n, k per live row (0: not over them) */
    int64_t rpt;        /* a row group or the fused cross-entropy: its rows per live row */
    int out[DM_LIVE_MAX_OUT];     /* the plan's outputs it writes as live rows (tensors)... */
    int64_t ld[DM_LIVE_MAX_OUT];  /* ... their elements per row: zeroed past the live rows */
    int nout;
} dm_live_group;

/* Is tensor t rows of `live` (graph.h; for "bj" the b x j rows in order), every other
 * letter inside a row? *ld (may be NULL): elements between rows. */
int dm_live_rows_of(const dm_graph *g, int t, const char *live, int64_t *ld);
/* Is tensor t an operand as ATTN and ATTN_BWD take it (letters bjhp): token rows "bj"
 * (*ld elements apart), the heads P apart, each head's P values together? */
int dm_live_head_rows(const dm_graph *g, int t, int64_t P, int64_t *ld);
/* Prepares lv for plan (lv->cap 0 if the plan has no live rows: nothing else to do);
 * dm_live_free releases it. */
dm_status dm_live_init(dm_live *lv, const dm_plan *plan);
void dm_live_free(dm_live *lv);
/* Group gi's way (*lg zeroed first). A lone contraction is mapped from its operands at A,
 * B, C (its inputs in op order and its output, where the backend has them: only pointer
 * arithmetic is done; NULL: not in memory, so it cannot follow them), on the plan's graph
 * and again on lv's two. DM_ERR_UNSUPPORTED (with a message naming the group) when the
 * group cannot follow them; the attention (ATTN, ATTN_BWD) and groups with no live
 * operand give all 0. */
dm_status dm_live_group_of(const dm_live *lv, int gi, float *A, float *B, float *C, dm_live_group *lg);
/* The sequences' first rows for an unpadded layer (ATTN's lengths): off[0] = 0, off[s + 1] =
 * off[s] + lengths[s], each a whole number from 0 to J, else DM_ERR_INVALID_ARG naming it. */
dm_status dm_live_offsets(int64_t B, int64_t J, const float *lengths, int64_t *off);

#endif
