/* unpad.c: the unpadded layer on the CPU (issue 25; graph/encoder.h's unpad). Its
 * attention is one ATTN op per pass (attn.c) over each sequence's own tokens; every other
 * group works on token rows, the batch's real tokens packed from row 0, and runs on as many
 * of them as the step has: a row group on that many rows (times its rows per token), a
 * contraction with the m, n or k that counts tokens cut to them. Which groups scale, and
 * by how much, is read off the plan once: a contraction's mapping (plan/gemm.c) is made
 * again with the tokens as one letter of two sizes, and the dimension that changes is the
 * one that counts them. The dropout's keys stay the padded layer's (tokkey), so both
 * layers draw the same masks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "cpu/exec.h"
#include "plan/live.h"

/* A "bjhp" operand of ATTN: token rows, heads p apart, p contiguous. */
static dm_status attn_rows(const dm_plan *plan, const dm_cpu_mem *arena, const dm_op *op, int t, int64_t P,
                           const float **p, int64_t *ld) {
    const dm_graph *g = plan->g;
    const dm_tensor *x = &g->t[t];
    const int ok = dm_live_head_rows(g, t, P, ld);
    *p = dm_cpu_mem_ptr(arena, t);
    if (!ok || !*p)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s must be in memory as token rows (letters bjhp, "
                       "layout bj first, each head's %lld values together)", op->name, x->name, (long long)P);
    return DM_OK;
}

/* Three "bjhp" operands (Q, K, V or their gradients) at p[0..2], the row stride they
 * share at *ld; `what` names them in the refusal of unequal strides. */
static dm_status attn_rows3(const dm_plan *plan, const dm_cpu_mem *arena, const dm_op *op, const int *t, int64_t P,
                            const float **p, int64_t *ld, const char *what) {
    for (int s = 0; s < 3; s++) {
        int64_t l;
        DM_TRY(attn_rows(plan, arena, op, t[s], P, &p[s], &l));
        if (s == 0) *ld = l;
        if (l != *ld) return dm_fail(DM_ERR_UNSUPPORTED, "%s: %s must have the same row stride", op->name, what);
    }
    return DM_OK;
}

dm_status dm_cpu_exec_init_attn(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, const dm_cpu_mem *arena,
                                 const dm_op *op) {
    const dm_graph *g = plan->g;
    const int bwd = op->kind == DM_OP_ATTN_BWD;
    if (eg->gr->nops != 1 || eg->gr->nbatch > 1)
        return dm_fail(DM_ERR_INTERNAL, "%s: the attention runs as a group of its own", op->name);
    const dm_tensor *q = &g->t[op->in[0]], *len = &g->t[op->in[3]], *pr = &g->t[op->in[bwd ? 4 : 0]];
    dm_attn_dims *a = &eg->ad;
    a->B = q->size[0];
    a->J = q->size[1];
    a->H = q->size[2];
    a->P = q->size[3];
    a->alpha = op->alpha;
    a->causal = op->causal;
    a->stream = op->stream;
    if (q->ndim != 4 || len->numel != (op->keymask ? a->B * a->J : a->B) || op->nindex != a->P || op->cols != a->J ||
        op->rows != a->B * a->H * a->J)
        return dm_fail(DM_ERR_INTERNAL, "%s: its rows, columns and head size do not match Q (%s)", op->name, q->name);
    if (a->J > 46340 || a->P > INT32_MAX / a->J)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: sizes beyond the attention kernel's (b %lld, j %lld, p %lld)", op->name,
                       (long long)a->B, (long long)a->J, (long long)a->P);
    dm_attn_io *io = &eg->aio;
    const float *qkv[3];
    DM_TRY(attn_rows3(plan, arena, op, op->in, a->P, qkv, &a->ldq, "Q, K and V"));
    io->q = qkv[0];
    io->k = qkv[1];
    io->v = qkv[2];
    io->lengths = dm_cpu_mem_ptr(arena, op->in[3]);
    io->mask = op->keymask ? io->lengths : NULL;
    const int tp = bwd ? op->in[4] : op->out[1];
    pr = &g->t[tp];
    io->probs = dm_cpu_mem_ptr(arena, tp);
    if (!io->lengths || !io->probs || pr->ndim != 4 || strcmp(pr->letters, "bhjk") || pr->stride[3] != 1 ||
        pr->stride[2] != a->J || pr->stride[1] != a->J * a->J || pr->stride[0] != a->H * a->J * a->J)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: the lengths and the probabilities (bhjk, its default layout) "
                       "must be in memory", op->name);
    const float *c;
    if (bwd) {
        DM_TRY(attn_rows(plan, arena, op, op->in[5], a->P, &io->dctx, &a->ldc));
        const float *d[3];
        DM_TRY(attn_rows3(plan, arena, op, op->out, a->P, d, &a->ldd, "dQ, dK and dV"));
        io->dq = (float *)d[0];
        io->dk = (float *)d[1];
        io->dv = (float *)d[2];
    } else {
        DM_TRY(attn_rows(plan, arena, op, op->out[0], a->P, &c, &a->ldc));
        io->ctx = (float *)c;
    }
    const int64_t need = dm_cpu_attn_work_floats(a->J) * ex->nthreads; /* one buffer for all: exec_init */
    if (need > ex->xwork_floats) ex->xwork_floats = need;
    eg->attn = 1 + bwd;
    eg->xop = op;
    return DM_OK;
}

/* How each group follows the live rows (plan/live.h; see dm_cpu_exec_init_tokens). */
static dm_status scale_groups(dm_cpu_exec *ex, const dm_plan *plan, const dm_cpu_mem *arena, const dm_live *lv) {
    for (int gi = 0; gi < ex->ngroups; gi++) {
        dm_exgroup *eg = &ex->groups[gi];
        if (eg->unusable || eg->attn) continue;
        dm_live_group lg;
        const dm_op *op = eg->contract ? &plan->g->op[plan->order[eg->gr->first]] : NULL;
        float *p[3] = {NULL, NULL, NULL}; /* a contraction's operands, in op order */
        for (int s = 0; s < 3 && op; s++) p[s] = dm_cpu_mem_ptr(arena, s < 2 ? op->in[s] : op->out[0]);
        DM_TRY(dm_live_group_of(lv, gi, p[0], p[1], p[2], &lg));
        for (int d = 0; d < 3; d++) eg->tok_mnk[d] = lg.tok_mnk[d];
        eg->tok_rpt = lg.rpt;
        for (int z = 0; z < lg.nout; z++) {
            eg->ztail[z] = dm_cpu_mem_ptr(arena, lg.out[z]);
            eg->zrow[z] = lg.ld[z];
        }
        eg->nztail = lg.nout;
    }
    return DM_OK;
}

dm_status dm_cpu_exec_init_tokens(dm_cpu_exec *ex, const dm_plan *plan, const dm_cpu_mem *arena) {
    const dm_graph *g = plan->g;
    dm_live lv;
    DM_TRY(dm_live_init(&lv, plan));
    const int64_t cap = lv.cap;
    const int attn = lv.attn;
    if (cap < 1) return DM_OK; /* no live rows */
    dm_status s = scale_groups(ex, plan, arena, &lv);
    dm_live_free(&lv);
    if (s == DM_ERR_UNSUPPORTED && !attn) { /* optional here: every step runs whole, set_rows says why */
        snprintf(ex->tok_why, sizeof ex->tok_why, "%s", dm_last_error());
        for (int gi = 0; gi < ex->ngroups; gi++) ex->groups[gi].tok_rpt = ex->groups[gi].nztail = 0;
        return DM_OK;
    }
    if (s == DM_OK && !(ex->tokkey = malloc(sizeof(int64_t) * (size_t)cap)))
        s = dm_fail(DM_ERR_OOM, "out of memory preparing the live rows");
    const int64_t B = g->dim['b' - 'a'], J = g->dim['j' - 'a'];
    if (s == DM_OK && attn && !(ex->tok_off = malloc(sizeof(int64_t) * (size_t)(B + 1))))
        s = dm_fail(DM_ERR_OOM, "out of memory preparing the unpadded layer");
    if (s != DM_OK) return attn ? dm_fail_context(s, "unpadded layer: ") : s;
    ex->tok_cap = cap;
    ex->tokens = cap;
    if (g->live[1]) ex->tok_b = g->dim[g->live[0] - 'a'], ex->tok_j = g->dim[g->live[1] - 'a'];
    for (int64_t r = 0; r < cap; r++) ex->tokkey[r] = r;
    for (int64_t b = 0; attn && b <= B; b++) ex->tok_off[b] = b * J; /* whole until set_rows */
    for (int gi = 0; attn && gi < ex->ngroups; gi++) /* the attention: the offsets of the step's start */
        if (ex->groups[gi].attn) ex->groups[gi].aio.off = ex->tok_off;
    return DM_OK;
}

/* Every contraction over the live rows cut to ex->tokens. */
static void cut_gemms(dm_cpu_exec *ex) {
    for (int gi = 0; gi < ex->ngroups; gi++) {
        dm_exgroup *eg = &ex->groups[gi];
        if (!eg->contract) continue;
        int *mnk[3] = {&eg->gemm.m, &eg->gemm.n, &eg->gemm.k};
        for (int d = 0; d < 3; d++)
            if (eg->tok_mnk[d]) *mnk[d] = (int)(eg->tok_mnk[d] * ex->tokens);
    }
}

dm_status dm_cpu_exec_set_rows(dm_cpu_exec *ex, int64_t rows, const float *lengths) {
    if (!ex->tok_cap)
        return dm_fail(DM_ERR_UNSUPPORTED, "this plan runs whole%s%s", ex->tok_why[0] ? ": " : " (no live rows)",
                       ex->tok_why);
    const dm_attn_dims *a = NULL;
    for (int gi = 0; gi < ex->ngroups && !a; gi++)
        if (ex->groups[gi].attn) a = &ex->groups[gi].ad;
    if (!lengths) {
        if (a) return dm_fail(DM_ERR_INVALID_ARG, "an unpadded layer takes its sequences' lengths");
        if (rows < 1 || rows > ex->tok_cap)
            return dm_fail(DM_ERR_INVALID_ARG, "%lld live rows: from 1 to %lld", (long long)rows,
                           (long long)ex->tok_cap);
        ex->tokens = rows;
        for (int64_t r = 0; ex->tok_b && r < rows; r++) ex->tokkey[r] = r; /* no sequences: the rows' own keys */
        cut_gemms(ex);
        return DM_OK;
    }
    /* an unpadded layer's sequences, or tokens rows "bj" packed from sequences of these
     * lengths (an unpadded model's embeddings: their dropout keyed by the padded rows) */
    const dm_attn_dims bj = {.B = ex->tok_b, .J = ex->tok_j};
    if (!a && !ex->tok_b) return dm_fail(DM_ERR_INVALID_ARG, "sequence lengths are for the tokens of sequences");
    if (!a) a = &bj;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(a->B + 1));
    if (!off) return dm_fail(DM_ERR_OOM, "out of memory for the sequence offsets");
    dm_status s = dm_live_offsets(a->B, a->J, lengths, off);
    if (s == DM_OK && off[a->B] == 0)
        s = dm_fail(DM_ERR_INVALID_ARG, "seq_lengths are all 0: a step needs at least one token");
    if (s == DM_OK) {
        ex->tokens = off[a->B];
        for (int64_t q = 0; q < a->B; q++)
            for (int64_t t = off[q]; t < off[q + 1]; t++) ex->tokkey[t] = q * a->J + (t - off[q]);
        if (ex->tok_off) memcpy(ex->tok_off, off, sizeof(int64_t) * (size_t)(a->B + 1));
        cut_gemms(ex);
    }
    free(off);
    return s;
}

void dm_cpu_exec_zero_tail(const dm_cpu_exec *ex, int gi) {
    const dm_exgroup *eg = &ex->groups[gi];
    for (int z = 0; z < eg->nztail && ex->tokens < ex->tok_cap; z++)
        memset(eg->ztail[z] + ex->tokens * eg->zrow[z], 0,
               sizeof(float) * (size_t)((ex->tok_cap - ex->tokens) * eg->zrow[z]));
}
