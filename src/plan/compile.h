/* compile.h: the one compiler. A layer configuration and the schedule's options go to the
 * step's graph (the forward pass and, by autodiff, the backward: graph/encoder.c), the
 * fused schedule's rewrites (graph/rewrite.c), the groups (fusion.c) and the memory plan
 * (memplan.c), with a tuned plan's layouts and algorithms applied last if one is given.
 * dm_layer_new, the tuner, the cost model and `dmove analyze` all compile through it. */
#ifndef DM_COMPILE_H
#define DM_COMPILE_H

#include "graph/encoder.h"
#include "plan/plan.h"
#include "plan/planfile.h"

/* Zero is the default of every field but cfg: the fused schedule of a training step with
 * the input's gradient, grouped for the CPU executor, buffers reused, no tuned plan. */
typedef struct {
    const dm_layer_config *cfg; /* the layer (checked here) */
    dm_schedule schedule;       /* fused: the rewrites and the fusion pass; unfused: the
                                 * builder's graph, one group per operator */
    int recompute;              /* attention's probabilities recomputed in the backward (a
                                 * rewrite of the fused schedule) */
    int forward_only;           /* no backward graph */
    int no_input_grad;          /* no gradient for hidden_states */
    int no_siblings;            /* fused: no sibling merges (dm_plan_build's siblings = 0),
                                 * for a backend that runs siblings side by side itself */
    int no_reuse;               /* every tensor its own bytes */
    int unpad;                  /* an encoder layer over packed tokens (dm_build_encoder) */
    int attn_op;                /* a padded encoder layer's attention as one ATTN op
                                 * (dm_build_encoder) */
    /* a tuned plan: the choices in memory (the tuner's), or else the plan file at
     * plan_file, its algorithms read by their names in `algos` (the table of the backend
     * that runs the plan) */
    const dm_choices *choices;
    const char *plan_file;
    const dm_algo_table *algos;
    /* the segment of a whole BERT (graph/encoder.h; default: an encoder layer) and, for
     * the others, the model's sizes */
    dm_segment segment;
    const dm_bert_sizes *sizes;
} dm_compile_opts;

/* Builds g (enc: its named tensors; NULL if not wanted) and, unless plan is NULL, plans
 * it. g and plan are initialised first; on failure they hold nothing (freeing them again
 * is harmless). */
dm_status dm_compile(const dm_compile_opts *o, dm_graph *g, dm_encoder *enc, dm_plan *plan);

/* Whether the CPU executor runs a padded encoder layer's attention as one ATTN op by
 * default (attn_op above; cpu/backend.c's rule, which the cost model's CPU grouping
 * follows): in a training step's fused schedule, not causal, without recompute or a tuned
 * plan (compile.c says why and what was measured). */
int dm_cpu_attn_op_default(const dm_layer_config *cfg, dm_schedule schedule, int forward_only, int recompute,
                           int tuned);

#endif
