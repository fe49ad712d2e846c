/* compile.c: the one compiler (compile.h): build, autodiff, rewrites, fusion, memory plan,
 * tuned choices, in that order. */
#include "plan/compile.h"

#include <string.h>

#include "core/status.h"
#include "graph/rewrite.h"

/* The fused schedule's rewrites keep every operator's id (graph/rewrite.c): the fused
 * plan's groups name the same operators as the unfused graph (dmove analyze reads one
 * through the other). */
static dm_status rewrite_fused(dm_graph *g) {
    const int nop = g->nop;
    DM_TRY(dm_rewrite_fused(g));
    if (g->nop != nop)
        return dm_fail(DM_ERR_INTERNAL, "the fused graph has %d operators, the graph %d", g->nop, nop);
    return DM_OK;
}

/* A layout only for what a tuner could have chosen: an intermediate (ACT) tensor that the
 * API neither reads nor writes (its exports keep the row-major layout the README promises:
 * inputs, outputs, parameters, gradients). An edited plan whose checksum was recomputed is
 * refused here instead of computing wrong results. */
static dm_status check_choices(const dm_choices *c, const dm_graph *g, const dm_encoder *e, const char *path) {
    if (c->nt != g->nt || c->nop != g->nop)
        return dm_fail(DM_ERR_INVALID_ARG, "the choices were made for another graph (%d tensors, %d ops; this one "
                       "has %d and %d)", c->nt, c->nop, g->nt, g->nop);
    for (int t = 0; t < g->nt; t++) {
        if (!c->layout[t][0]) continue;
        int exported = g->t[t].role != DM_ROLE_ACT;
        for (int k = 0; k < e->n && !exported; k++) exported = dm_tensor_root(g, e->e[k].tensor) == t;
        if (exported)
            return dm_fail(DM_ERR_FORMAT, "plan '%s' gives a layout to %s, which the API reads or writes in row-major "
                           "order (an input, output, parameter or gradient): no tuner makes that; run 'dmove tune' "
                           "for a new plan", path ? path : "(given)", g->t[t].name);
    }
    return DM_OK;
}

/* The tuned plan's layouts and algorithms, on the planned graph. */
static dm_status apply_choices(const dm_compile_opts *o, dm_graph *g, const dm_encoder *e, dm_plan *plan) {
    if (o->choices) {
        DM_TRY(check_choices(o->choices, g, e, NULL));
        return dm_choices_apply(o->choices, g, plan);
    }
    /* what a plan file is checked against besides the sizes */
    const dm_layer_options lo = {.schedule = o->schedule, .recompute = o->recompute, .forward_only = o->forward_only};
    dm_choices loaded;
    DM_TRY(dm_plan_load(o->plan_file, o->cfg, &lo, g, o->algos, &loaded));
    dm_status s = check_choices(&loaded, g, e, o->plan_file);
    if (s == DM_OK) s = dm_choices_apply(&loaded, g, plan);
    dm_choices_free(&loaded);
    return s;
}

dm_status dm_compile(const dm_compile_opts *o, dm_graph *g, dm_encoder *enc, dm_plan *plan) {
    dm_encoder own;
    dm_graph_init(g);
    if (plan) memset(plan, 0, sizeof *plan);
    if (!o || !o->cfg) return dm_fail(DM_ERR_INVALID_ARG, "dm_compile: no configuration given");
    const int fused = o->schedule == DM_SCHED_FUSED;
    dm_encoder *e = enc ? enc : &own;
    dm_status s;
    switch (o->segment) {
    case DM_SEG_ENCODER: s = dm_build_encoder(g, o->cfg, o->forward_only, !o->no_input_grad, o->unpad, o->attn_op, e); break;
    case DM_SEG_EMBEDDINGS: s = dm_build_embeddings(g, o->cfg, o->sizes, o->forward_only, e); break;
    case DM_SEG_MLM_HEAD: s = dm_build_mlm_head(g, o->cfg, o->sizes, o->forward_only, e); break;
    case DM_SEG_CLS_HEAD: s = dm_build_cls_head(g, o->cfg, o->sizes, o->forward_only, e); break;
    default: s = dm_fail(DM_ERR_INVALID_ARG, "dm_compile: segment %d unknown", (int)o->segment);
    }
    if (s == DM_OK && o->segment != DM_SEG_ENCODER && (o->recompute || o->choices || o->plan_file))
        s = dm_fail(DM_ERR_UNSUPPORTED, "recompute and tuned plans are an encoder layer's, not the embeddings' or "
                    "the head's");
    if (s == DM_OK && o->unpad && (o->recompute || o->choices || o->plan_file))
        s = dm_fail(DM_ERR_UNSUPPORTED, "an unpadded layer takes no %s: %s", o->recompute ? "--recompute" : "tuned plan",
                    o->recompute ? "its attention keeps the probabilities of the real tokens alone"
                                 : "`dmove tune` tunes the padded layer; run unpadded without --plan");
    if (s == DM_OK && o->attn_op && (o->recompute || o->choices || o->plan_file))
        s = dm_fail(DM_ERR_UNSUPPORTED, "attention as one op (attention_op) takes no %s",
                    o->recompute ? "recompute (that rewrites the attention's own ops): leave attention_op at 0 or -1"
                                 : "tuned plan (`dmove tune` tunes the attention's own ops): leave attention_op at 0 or -1");
    if (s == DM_OK && fused) s = rewrite_fused(g);
    if (s == DM_OK && o->recompute) s = dm_rewrite_recompute_attention(g, NULL);
    if (s == DM_OK && plan) s = dm_plan_build(g, fused, !o->no_siblings, o->no_reuse, plan);
    if (s == DM_OK && plan && (o->choices || o->plan_file)) s = apply_choices(o, g, e, plan);
    if (s != DM_OK) {
        if (plan) dm_plan_free(plan);
        dm_graph_free(g);
    }
    return s;
}

/* The padded attention as one op (cpu/attn.c) in a training layer's fused schedule. Its
 * forward streams the probabilities alone to memory and its backward draws the dropout's
 * mask again, where the fused attention groups write and read the dropped probabilities
 * too (the dropout's backward reads its mask off them): j^2 floats an item less each
 * way. Measured on the Xeon (2026-11-29, 2 threads, groups' medians of 5 steps, one op
 * against the groups, forward + backward ms): BERT-large's layer at b=2 j=512 34.4 vs 40.2
 * (AMX), 36.6 vs 40.1 (AVX-512), 45.5 vs 50.2 (AVX2); BERT-base's b=8 j=128 8.1 vs 8.5,
 * 8.0 vs 8.3, 10.4 vs 10.4. Not for inference (the one op streams the probabilities that
 * a forward-only layer never keeps), a causal layer (it has no such op), the unfused
 * schedule (the ops one by one: the baseline), recompute or a tuned plan (they rewrite or
 * name the attention's ops). */
int dm_cpu_attn_op_default(const dm_layer_config *cfg, dm_schedule schedule, int forward_only, int recompute,
                           int tuned) {
    return schedule == DM_SCHED_FUSED && !forward_only && !recompute && !tuned && !cfg->causal;
}
