/* pairs.c: which contractions can run side by side. In the backward pass a layer's
 * weight gradient (dW = X^T dY) needs only dY and a saved activation, so it can start
 * as soon as the input gradient's GEMM (dX = dY W^T) does, and nothing before its own
 * turn reads what it writes. Running the two at once, each on half the threads, keeps
 * both GEMMs on a thread count where they are efficient instead of splitting each.
 * Which contractions ask for a partner is the backend's choice, read from its algorithm
 * table (DM_ALGO_BESIDE: the CPU's "concurrent" algorithms); the pairing itself is a
 * question of the plan's dependencies, answered here for the executor, the tuner and the
 * reports alike. */
#include <stdlib.h>

#include "core/status.h"
#include "plan/plan.h"

static int lone_contraction(const dm_plan *plan, int gi) {
    const dm_group *gr = &plan->groups[gi];
    return gr->nops == 1 && gr->nbatch <= 1 && plan->g->op[plan->order[gr->first]].kind == DM_OP_CONTRACT;
}

/* 1 if group gi reads (want_reads) or writes (want_writes) a tensor with root r. */
static int touches(const dm_plan *plan, int gi, int r, int want_reads, int want_writes) {
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        for (int s = 0; want_reads && s < op->nin; s++)
            if (dm_tensor_root(g, op->in[s]) == r) return 1;
        for (int s = 0; want_writes && s < op->nout; s++)
            if (dm_tensor_root(g, op->out[s]) == r) return 1;
    }
    return 0;
}

static int can_move_up(const dm_plan *plan, int g1, int g2) {
    const dm_graph *g = plan->g;
    const dm_op *op = &g->op[plan->order[plan->groups[g2].first]];
    for (int s = 0; s < op->nout; s++) {
        int r = dm_tensor_root(g, op->out[s]);
        if (g->t[r].role != DM_ROLE_PARAM_GRAD) return 0;
        for (int h = g1; h < g2; h++)
            if (touches(plan, h, r, 1, 1)) return 0;
    }
    for (int s = 0; s < op->nin; s++) {
        int r = dm_tensor_root(g, op->in[s]);
        for (int h = g1; h < g2; h++)
            if (touches(plan, h, r, 0, 1)) return 0;
    }
    return 1;
}

int dm_plan_partner(const dm_plan *plan, int g1, const uint8_t *claimed) {
    if (!plan || g1 < 0 || g1 >= plan->ngroups || !lone_contraction(plan, g1) || (claimed && claimed[g1]))
        return -1;
    for (int g2 = g1 + 1; g2 < plan->ngroups && plan->groups[g2].pass == plan->groups[g1].pass; g2++)
        if (lone_contraction(plan, g2) && !(claimed && claimed[g2]) && can_move_up(plan, g1, g2)) return g2;
    return -1;
}

dm_status dm_plan_pairs(const dm_plan *plan, int *partner, int *beside) {
    uint8_t *claimed = calloc((size_t)plan->ngroups + 1, 1);
    if (!claimed) return dm_fail(DM_ERR_OOM, "out of memory");
    for (int G = 0; G < plan->ngroups; G++) {
        partner[G] = -1;
        if (beside) beside[G] = -1;
    }
    for (int G = 0; plan->algo && G < plan->ngroups; G++) {
        if (!(dm_algo_flags(plan->algos, plan->algo[plan->order[plan->groups[G].first]]) & DM_ALGO_BESIDE)) continue;
        int p = dm_plan_partner(plan, G, claimed);
        if (p < 0) continue;
        claimed[G] = claimed[p] = 1;
        partner[G] = p;
        if (beside) beside[p] = G;
    }
    free(claimed);
    return DM_OK;
}
