/* plan.h: how a graph is computed: fused groups in execution order, which tensors live
 * in memory (the rest stay in per-thread scratch rows), and the arena offsets of those
 * tensors by liveness. */
#ifndef DM_PLAN_H
#define DM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "plan/algo.h"

typedef struct {
    int first;        /* index into plan->order */
    int nops;
    int pass;         /* 0 forward, 1 backward */
    dm_op_class cls;  /* contraction; else normalization if any op is; else elementwise */
    int64_t rows, cols;
    int64_t nbatch;   /* > 1: a batched group (contractions and row ops, run per batch
                       * index of `batch`, intermediates as per-thread tiles) */
    char batch[4];    /* the batch letters, outermost first (e.g. "bh") */
} dm_group;

typedef struct {
    const dm_graph *g;
    int *order;          /* op ids, grouped, in execution order */
    dm_group *groups;
    int ngroups;
    uint8_t *in_memory;  /* per tensor id (roots): materialized */
    int64_t *offset;     /* per tensor id (roots): byte offset in the arena, -1 if none */
    size_t arena_bytes;
    size_t activation_bytes; /* the liveness-planned part */
    int max_cols;        /* widest row of a pointwise group (scratch size) */
    uint8_t *algo;       /* per op: contraction algorithm, an id of `algos`, or NULL: defaults */
    const dm_algo_table *algos; /* the backend's table that names algo's ids */
    int no_reuse;        /* as built: every tensor its own bytes */
} dm_plan;

/* fusion.c: groups ops. fused = 0 gives one group per op (the unfused schedule).
 * siblings (fused only): a lone batched contraction also joins an independent batched
 * group that reads one of its inputs (the CPU executor's plans; the CUDA executor's fused
 * attention kernels take the groups without). */
dm_status dm_plan_build(const dm_graph *g, int fused, int siblings, int no_reuse, dm_plan *plan);
void dm_plan_free(dm_plan *plan);
/* Where root r's bytes are (NULL if not materialized): an offset below the plan's
 * persistent bytes (arena_bytes - activation_bytes: parameters, inputs, outputs, ...) in
 * `arena`, the activations past them at `act`: arena + those bytes in one arena, or memory
 * that several layers' activations share (layer_internal.h's dm_layer_act_share). */
static inline char *dm_plan_root_addr(const dm_plan *plan, char *arena, char *act, int r) {
    if (plan->offset[r] < 0) return NULL;
    const size_t at = (size_t)plan->offset[r], own = plan->arena_bytes - plan->activation_bytes;
    return at < own ? arena + at : act + (at - own);
}
/* memplan.c: decides in_memory and offsets (called by dm_plan_build, and again by
 * dm_choices_apply: the in-place reuse of a row group's input for its output needs both
 * laid out alike, so offsets follow the layouts). */
dm_status dm_plan_memory(dm_plan *plan, int no_reuse);
/* pairs.c: the contraction that may run beside group g1 (contraction algorithm
 * "concurrent"): the first later group of g1's pass that is a lone contraction
 * writing only parameter gradients, not claimed (claimed: per group, or NULL), reading
 * nothing that g1 or a group between writes, and writing nothing that g1 or a group
 * between reads or writes. It can then run at g1's turn. -1 if none, or if g1 is not a
 * lone contraction or is claimed. */
int dm_plan_partner(const dm_plan *plan, int g1, const uint8_t *claimed);
/* The pairs the plan's contractions with a DM_ALGO_BESIDE algorithm (plan->algo: the
 * CPU's "concurrent") form, in group order as the CPU executor forms them: partner[g]
 * (ngroups entries) is the group run beside g, or -1; beside (ngroups entries, or NULL)
 * the inverse: the group g runs beside, or -1. A mark with no partner is left out here
 * (the executor refuses it). DM_ERR_OOM. */
dm_status dm_plan_pairs(const dm_plan *plan, int *partner, int *beside);
/* Text listing of the groups, with accumulated seconds per group if given (caller frees);
 * pairs: also name the contractions run side by side and the row groups run in a GEMM's
 * epilogue ("direct_rows") (the CPU executor runs them so). */
char *dm_plan_describe(const dm_plan *plan, const double *group_secs, int pairs);

#endif
