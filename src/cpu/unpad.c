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

/* Is tensor t rows of `live` (g->live: token_rows): for "bj", letters b and j, j's rows the b x j rows in
 * order (b's stride j of j's); for one letter, that letter outermost; every other letter
 * inside a row? *ld: floats between rows. */
static int rows_of(const dm_graph *g, int t, const char *live, int64_t *ld) {
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
static int token_rows(const dm_graph *g, int t, int64_t *ld) { return rows_of(g, t, g->live, ld); }

/* A "bjhp" operand of ATTN: token rows, heads p apart, p contiguous. */
static dm_status attn_rows(const dm_plan *plan, char *arena, const dm_op *op, int t, int64_t P, const float **p,
                           int64_t *ld) {
    const dm_graph *g = plan->g;
    const dm_tensor *x = &g->t[t];
    int ok = x->ndim == 4 && !strcmp(x->letters, "bjhp") && rows_of(g, t, "bj", ld) && x->stride[2] == P &&
             x->stride[3] == 1;
    *p = dm_cpu_tensor_ptr(plan, arena, t);
    if (!ok || !*p)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: operand %s must be in memory as token rows (letters bjhp, "
                       "layout bj first, each head's %lld values together)", op->name, x->name, (long long)P);
    return DM_OK;
}

/* Three "bjhp" operands (Q, K, V or their gradients) at p[0..2], the row stride they
 * share at *ld; `what` names them in the refusal of unequal strides. */
static dm_status attn_rows3(const dm_plan *plan, char *arena, const dm_op *op, const int *t, int64_t P,
                            const float **p, int64_t *ld, const char *what) {
    for (int s = 0; s < 3; s++) {
        int64_t l;
        DM_TRY(attn_rows(plan, arena, op, t[s], P, &p[s], &l));
        if (s == 0) *ld = l;
        if (l != *ld) return dm_fail(DM_ERR_UNSUPPORTED, "%s: %s must have the same row stride", op->name, what);
    }
    return DM_OK;
}

dm_status dm_cpu_exec_init_attn(dm_cpu_exec *ex, dm_exgroup *eg, const dm_plan *plan, char *arena, const dm_op *op) {
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
    if (q->ndim != 4 || len->numel != a->B || op->nindex != a->P || op->cols != a->J ||
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
    io->lengths = dm_cpu_tensor_ptr(plan, arena, op->in[3]);
    const int tp = bwd ? op->in[4] : op->out[1];
    pr = &g->t[tp];
    io->probs = dm_cpu_tensor_ptr(plan, arena, tp);
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

/* A copy of g's tensors with every live-rows tensor's rows read as one run of n (for "bj":
 * b 1, j n): the graph a contraction's mapping is made on again. */
static dm_status token_graph(const dm_graph *g, int64_t n, dm_graph *out) {
    *out = *g;
    out->t = malloc(sizeof(dm_tensor) * (size_t)g->nt);
    if (!out->t) return dm_fail(DM_ERR_OOM, "out of memory preparing the unpadded layer");
    memcpy(out->t, g->t, sizeof(dm_tensor) * (size_t)g->nt);
    for (int t = 0; t < g->nt; t++) {
        if (!token_rows(g, t, NULL)) continue;
        dm_tensor *x = &out->t[t];
        for (int d = 0; d < x->ndim; d++) {
            if (x->letters[d] == g->live[0]) x->size[d] = g->live[1] ? 1 : n;
            if (g->live[1] && x->letters[d] == g->live[1]) x->size[d] = n;
        }
    }
    return DM_OK;
}

/* How each group scales with the live rows (see dm_cpu_exec_init_tokens). */
static dm_status scale_groups(dm_cpu_exec *ex, const dm_plan *plan, char *arena, int64_t cap) {
    const dm_graph *g = plan->g;
    dm_graph g1, g2;
    DM_TRY(token_graph(g, cap, &g1));
    dm_status s = token_graph(g, cap - 1, &g2);
    for (int gi = 0; gi < ex->ngroups && s == DM_OK; gi++) {
        dm_exgroup *eg = &ex->groups[gi];
        const dm_group *gr = eg->gr;
        const dm_op *first = &g->op[plan->order[gr->first]];
        if (eg->unusable || eg->attn) continue;
        const int lone = eg->contract || eg->xent; /* one op, no dm_exop */
        for (int k = 0; k < (lone ? 1 : eg->nops); k++) { /* the plan's outputs it writes */
            const dm_op *op = lone ? first : eg->ops[k].op;
            for (int q = 0; q < op->nout; q++) {
                const int t = op->out[q];
                int64_t ld;
                float *p = dm_cpu_tensor_ptr(plan, arena, t);
                if (g->t[t].role != DM_ROLE_OUTPUT || !p || !token_rows(g, t, &ld)) continue;
                if (eg->nztail == 4) {
                    s = dm_fail(DM_ERR_INTERNAL, "the group of %s writes more than 4 outputs", first->name);
                    break;
                }
                eg->ztail[eg->nztail] = p;
                eg->zrow[eg->nztail++] = ld;
            }
        }
        if (s != DM_OK) break;
        if (eg->contract) { /* its mapping with the tokens as one letter of cap and cap - 1 rows */
            dm_gemm_map m1, m2;
            float *A = eg->gemm.swapped ? eg->gemm.B : eg->gemm.A, *B = eg->gemm.swapped ? eg->gemm.A : eg->gemm.B;
            s = dm_gemm_map_prepare(&m1, &g1, first, A, B, eg->gemm.C);
            if (s == DM_OK) s = dm_gemm_map_prepare(&m2, &g2, first, A, B, eg->gemm.C);
            if (s != DM_OK) break;
            const int full[3] = {eg->gemm.m, eg->gemm.n, eg->gemm.k}, a1[3] = {m1.m, m1.n, m1.k},
                      a2[3] = {m2.m, m2.n, m2.k};
            int same = m1.transA == eg->gemm.transA && m1.transB == eg->gemm.transB && m1.lda == eg->gemm.lda &&
                       m1.ldb == eg->gemm.ldb && m1.ldc == eg->gemm.ldc && m1.swapped == eg->gemm.swapped &&
                       m1.nbatch == eg->gemm.nbatch && m2.nbatch == m1.nbatch;
            for (int d = 0; d < 3; d++) {
                same &= a1[d] == full[d];
                eg->tok_mnk[d] = a1[d] != a2[d] ? a1[d] - a2[d] : 0;
                same &= !eg->tok_mnk[d] || eg->tok_mnk[d] * cap == full[d];
            }
            if (!same || eg->gemm.nbatch != 1)
                s = dm_fail(DM_ERR_UNSUPPORTED, "contraction %s does not keep the live rows (%s) as the rows of "
                            "one GEMM dimension in this layout", first->name, g->live);
            continue;
        }
        if (eg->xent) { /* the fused cross-entropy: its rows m */
            if (first->rows % cap)
                s = dm_fail(DM_ERR_UNSUPPORTED, "%s does not run over the live rows (%s)", first->name, g->live);
            eg->tok_rpt = first->rows / cap;
            continue;
        }
        if (eg->nbatch > 1 || gr->rows % cap) {
            s = dm_fail(DM_ERR_UNSUPPORTED, "the group of %s does not run over the live rows (%s)", first->name,
                        g->live);
            break;
        }
        eg->tok_rpt = gr->rows / cap;
        for (int k = 0; k < eg->nops && s == DM_OK; k++) /* its row operands: token rows */
            for (int io = 0; io < 2; io++)
                for (int q = 0; q < (io ? eg->ops[k].op->nout : eg->ops[k].op->nin); q++) {
                    const int t = io ? eg->ops[k].op->out[q] : eg->ops[k].op->in[q];
                    const dm_arg_kind kind = io ? dm_arg_out(eg->ops[k].op->kind, q) : dm_arg_in(eg->ops[k].op->kind, q);
                    if ((kind == DM_ARG_FULL || kind == DM_ARG_ROWSCALAR) && !token_rows(g, t, NULL))
                        s = dm_fail(DM_ERR_UNSUPPORTED, "%s's operand %s is not live rows (%s)",
                                    eg->ops[k].op->name, g->t[t].name, g->live);
                }
    }
    free(g1.t);
    free(g2.t);
    return s;
}

dm_status dm_cpu_exec_init_tokens(dm_cpu_exec *ex, const dm_plan *plan, char *arena) {
    const dm_graph *g = plan->g;
    int attn = 0;
    for (int o = 0; o < g->nop; o++) attn |= g->op[o].kind == DM_OP_ATTN || g->op[o].kind == DM_OP_ATTN_BWD;
    const int64_t cap = !g->live[0] ? 0 : g->live[1] ? g->dim[g->live[0] - 'a'] * g->dim[g->live[1] - 'a']
                                                     : g->dim[g->live[0] - 'a'];
    if (cap < 1) return DM_OK; /* no live rows */
    dm_status s = scale_groups(ex, plan, arena, cap);
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
    dm_status s = dm_cpu_attn_offsets(a, lengths, off);
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
