/* live.c: how a plan's groups follow its live rows (live.h), one analysis for every
 * backend's set_rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "plan/live.h"

int dm_live_rows_of(const dm_graph *g, int t, const char *live, int64_t *ld) {
    const dm_tensor *x = &g->t[t];
    const char outer = live[0], inner = live[1] ? live[1] : live[0];
    int db = -1, dj = -1;
    for (int d = 0; outer && d < x->ndim; d++) {
        if (x->letters[d] == outer) db = d;
        if (x->letters[d] == inner) dj = d;
    }
    if (db < 0 || dj < 0 || (db != dj && x->stride[db] != x->size[dj] * x->stride[dj])) return 0;
    for (int d = 0; d < x->ndim; d++) /* every other letter inside a row */
        if (d != db && d != dj && x->size[d] > 1 && x->stride[d] >= x->stride[dj]) return 0;
    if (ld) *ld = x->stride[dj];
    return 1;
}

int dm_live_head_rows(const dm_graph *g, int t, int64_t P, int64_t *ld) {
    const dm_tensor *x = &g->t[t];
    return x->ndim == 4 && !strcmp(x->letters, "bjhp") && dm_live_rows_of(g, t, "bj", ld) && x->stride[2] == P &&
           x->stride[3] == 1;
}

/* A copy of g's tensors with every live-rows tensor's rows read as one run of n (for "bj":
 * b 1, j n): the graph a contraction's mapping is made on again. */
static dm_status live_graph(const dm_graph *g, int64_t n, dm_graph *out) {
    *out = *g;
    out->t = malloc(sizeof(dm_tensor) * (size_t)g->nt);
    if (!out->t) return dm_fail(DM_ERR_OOM, "out of memory preparing the live rows");
    memcpy(out->t, g->t, sizeof(dm_tensor) * (size_t)g->nt);
    for (int t = 0; t < g->nt; t++) {
        if (!dm_live_rows_of(g, t, g->live, NULL)) continue;
        dm_tensor *x = &out->t[t];
        for (int d = 0; d < x->ndim; d++) {
            if (x->letters[d] == g->live[0]) x->size[d] = g->live[1] ? 1 : n;
            if (g->live[1] && x->letters[d] == g->live[1]) x->size[d] = n;
        }
    }
    return DM_OK;
}

dm_status dm_live_init(dm_live *lv, const dm_plan *plan) {
    const dm_graph *g = plan->g;
    memset(lv, 0, sizeof *lv);
    lv->plan = plan;
    for (int o = 0; o < g->nop; o++) lv->attn |= g->op[o].kind == DM_OP_ATTN || g->op[o].kind == DM_OP_ATTN_BWD;
    const int64_t cap = !g->live[0] ? 0 : g->live[1] ? g->dim[g->live[0] - 'a'] * g->dim[g->live[1] - 'a']
                                                     : g->dim[g->live[0] - 'a'];
    if (cap < 1) return DM_OK; /* no live rows */
    DM_TRY(live_graph(g, cap, &lv->g1));
    dm_status s = live_graph(g, cap - 1, &lv->g2);
    if (s != DM_OK) {
        dm_live_free(lv);
        return s;
    }
    lv->cap = cap;
    return DM_OK;
}

void dm_live_free(dm_live *lv) {
    free(lv->g1.t);
    free(lv->g2.t);
    lv->g1.t = lv->g2.t = NULL;
    lv->cap = 0;
}

/* The contraction op: which of m, n, k count the live rows. */
static dm_status live_gemm(const dm_live *lv, const dm_op *op, float *A, float *B, float *C, dm_live_group *lg) {
    dm_gemm_map m0, m1, m2;
    const dm_gemm_map *full = &m0;
    DM_TRY(dm_gemm_map_prepare(&m0, lv->plan->g, op, A, B, C));
    DM_TRY(dm_gemm_map_prepare(&m1, &lv->g1, op, A, B, C));
    DM_TRY(dm_gemm_map_prepare(&m2, &lv->g2, op, A, B, C));
    const int64_t f[3] = {full->m, full->n, full->k}, a1[3] = {m1.m, m1.n, m1.k}, a2[3] = {m2.m, m2.n, m2.k};
    int same = m1.transA == full->transA && m1.transB == full->transB && m1.lda == full->lda &&
               m1.ldb == full->ldb && m1.ldc == full->ldc && m1.swapped == full->swapped &&
               m1.nbatch == full->nbatch && m2.nbatch == m1.nbatch;
    for (int d = 0; d < 3; d++) {
        same &= a1[d] == f[d];
        lg->tok_mnk[d] = a1[d] != a2[d] ? a1[d] - a2[d] : 0;
        same &= !lg->tok_mnk[d] || lg->tok_mnk[d] * lv->cap == f[d];
    }
    if (!same || full->nbatch != 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s does not keep the live rows (%s) as the rows of one "
                       "GEMM dimension in this layout", op->name, lv->plan->g->live);
    return DM_OK;
}

dm_status dm_live_group_of(const dm_live *lv, int gi, float *A, float *B, float *C, dm_live_group *lg) {
    const dm_plan *plan = lv->plan;
    const dm_graph *g = plan->g;
    const dm_group *gr = &plan->groups[gi];
    const dm_op *first = &g->op[plan->order[gr->first]];
    memset(lg, 0, sizeof *lg);
    if (!lv->cap || first->kind == DM_OP_ATTN || first->kind == DM_OP_ATTN_BWD) return DM_OK;
    for (int k = 0; k < gr->nops; k++) { /* the plan's outputs it writes as live rows */
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        for (int q = 0; q < op->nout; q++) {
            const int t = op->out[q];
            int64_t ld;
            if (g->t[t].role != DM_ROLE_OUTPUT || !plan->in_memory[dm_tensor_root(g, t)] ||
                !dm_live_rows_of(g, t, g->live, &ld))
                continue;
            if (lg->nout == DM_LIVE_MAX_OUT)
                return dm_fail(DM_ERR_INTERNAL, "the group of %s writes more than %d outputs", first->name,
                               DM_LIVE_MAX_OUT);
            lg->out[lg->nout] = t;
            lg->ld[lg->nout++] = ld;
        }
    }
    if (gr->nbatch > 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "the batched group of %s does not run over the live rows (%s)",
                       first->name, g->live);
    if (first->kind == DM_OP_CONTRACT) {
        if (!A || !B || !C || gr->nops != 1)
            return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: not a lone GEMM that can follow the live rows (%s)",
                           first->name, g->live);
        return live_gemm(lv, first, A, B, C, lg);
    }
    if (first->kind == DM_OP_LINEAR_XENT || first->kind == DM_OP_LINEAR_XENT_BWD) { /* its rows m */
        if (first->rows % lv->cap)
            return dm_fail(DM_ERR_UNSUPPORTED, "%s does not run over the live rows (%s)", first->name, g->live);
        lg->rpt = first->rows / lv->cap;
        return DM_OK;
    }
    if (gr->rows % lv->cap)
        return dm_fail(DM_ERR_UNSUPPORTED, "the group of %s does not run over the live rows (%s)", first->name,
                       g->live);
    lg->rpt = gr->rows / lv->cap;
    for (int k = 0; k < gr->nops; k++) { /* its row operands: live rows */
        const dm_op *op = &g->op[plan->order[gr->first + k]];
        for (int io = 0; io < 2; io++)
            for (int q = 0; q < (io ? op->nout : op->nin); q++) {
                const int t = io ? op->out[q] : op->in[q];
                const dm_arg_kind kind = io ? dm_arg_out(op->kind, q) : dm_arg_in(op->kind, q);
                if ((kind == DM_ARG_FULL || kind == DM_ARG_ROWSCALAR) && !dm_live_rows_of(g, t, g->live, NULL))
                    return dm_fail(DM_ERR_UNSUPPORTED, "%s's operand %s is not live rows (%s)", op->name,
                                   g->t[t].name, g->live);
            }
    }
    return DM_OK;
}

dm_status dm_live_offsets(int64_t B, int64_t J, const float *lengths, int64_t *off) {
    off[0] = 0;
    for (int64_t s = 0; s < B; s++) {
        const float l = lengths[s];
        if (!(l >= 0 && l <= (float)J && l == (float)(int64_t)l))
            return dm_fail(DM_ERR_INVALID_ARG, "seq_lengths[%lld] = %g: a sequence's length is a whole number "
                           "from 0 to the layer's sequence length %lld", (long long)s, (double)l, (long long)J);
        off[s + 1] = off[s] + (int64_t)l;
    }
    return DM_OK;
}
