/* memplan.c: which tensors live in memory and where. A root tensor is materialized when
 * the user sees it (inputs, parameters, their gradients, outputs), when a contraction
 * reads or writes it, when another group reads it, or when it is a column reduction.
 * Everything else is a row that lives and dies inside one fused group. Activations get
 * arena offsets by first-fit over their live intervals (in group order), so buffers are
 * reused within a step and the same arena serves every step.
 *
 * In place: an unfused plan reuses an op's input for its output (the input dies one
 * group earlier); a fused row group both reads the input and writes the output, so their
 * intervals meet and first-fit alone would keep both (the fused plan would need more
 * memory than the unfused one: BERT-base 88 MB of intermediates against 76). So a row
 * group's output takes the bytes of a same-shaped input that dies in the group when
 * every read of that input comes in an earlier op of the group than the write, or in
 * the writing op itself if that op is element by element (output element c from input
 * element c only): each row is then read before it is overwritten, by the thread (or GPU
 * team) that owns the row. Row reductions (softmax, LayerNorm) never write over their
 * own input: they read it in several passes. A table gathered from (EMBED's T input) is
 * read at any row, so nothing takes its bytes in the group that reads it, and a table
 * written by index (EMBED_BWD's X output) never takes an input's. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "plan/plan.h"

#define ALIGN 64

/* Inside a batched group, a root laid out batch-outermost can be a per-thread tile. */
static int tileable(const dm_graph *g, const dm_group *gr, int r) {
    size_t n = strlen(gr->batch);
    return gr->nbatch > 1 && g->t[r].base < 0 && g->t[r].role == DM_ROLE_ACT &&
           strncmp(g->t[r].letters, gr->batch, n) == 0;
}

/* Tensors a and b (roots) address their elements alike: same letters, sizes, strides. */
static int same_shape(const dm_graph *g, int a, int b) {
    const dm_tensor *x = &g->t[a], *y = &g->t[b];
    if (x->ndim != y->ndim || x->numel != y->numel || strcmp(x->letters, y->letters) != 0) return 0;
    for (int d = 0; d < x->ndim; d++)
        if (x->size[d] != y->size[d] || x->stride[d] != y->stride[d]) return 0;
    return 1;
}

/* A whole-row operand of an op over rows x cols: an intermediate root (not a view), one
 * row of it per row of the op (cols > 1: not a per-row statistic). */
static int row_operand(const dm_graph *g, const dm_op *op, int t) {
    return g->t[t].base < 0 && g->t[t].role == DM_ROLE_ACT && op->cols > 1 &&
           g->t[t].numel == op->rows * op->cols;
}

/* alias[O] = I: output O of a row group takes the bytes of input I (see the top). */
static void plan_in_place(const dm_plan *plan, const int64_t *first, const int64_t *last, int *alias) {
    const dm_graph *g = plan->g;
    for (int G = 0; G < plan->ngroups; G++) {
        const dm_group *gr = &plan->groups[G];
        int rowgroup = gr->nbatch <= 1;
        for (int k = 0; k < gr->nops && rowgroup; k++)
            rowgroup = dm_op_kind_class(g->op[plan->order[gr->first + k]].kind) != DM_CLASS_CONTRACTION;
        if (!rowgroup) continue;
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[plan->order[gr->first + k]];
            /* a pointwise op may overwrite what it reads itself (its kernels: cpu/eltwise.c
             * takes no restrict on those pointers; the GPU's row code loads before it stores) */
            const int self = dm_op_pointwise(op->kind);
            for (int s = 0; s < op->nout; s++) {
                const int o = op->out[s];
                if (!plan->in_memory[o] || !row_operand(g, op, o) || first[o] != G || alias[o] >= 0 ||
                    dm_arg_out(op->kind, s) != DM_ARG_FULL) /* a scatter's table: not row for row */
                    continue;
                int writers = 0;
                for (int q = 0; q < g->nop; q++)
                    for (int u = 0; u < g->op[q].nout; u++) writers += dm_tensor_root(g, g->op[q].out[u]) == o;
                if (writers != 1) continue;
                /* an input of an earlier op of the group (or of this one), dying here, read
                 * by no later op */
                for (int j = 0; j < k + self && alias[o] < 0; j++) {
                    const dm_op *rd = &g->op[plan->order[gr->first + j]];
                    for (int v = 0; v < rd->nin && alias[o] < 0; v++) {
                        const int in = rd->in[v];
                        if (!plan->in_memory[in] || !row_operand(g, rd, in) || last[in] != G || !same_shape(g, in, o) ||
                            dm_arg_in(rd->kind, v) == DM_ARG_INDEXED)
                            continue;
                        int taken = 0, later = 0;
                        for (int t = 0; t < g->nt && !taken; t++) taken = alias[t] == in;
                        /* every read up to the write: the tensor itself (no view), whole rows,
                         * so row r is read only where row r of the output goes */
                        for (int q = 0; q < k + self && !later; q++) {
                            const dm_op *op2 = &g->op[plan->order[gr->first + q]];
                            for (int w = 0; w < op2->nin; w++)
                                if (dm_tensor_root(g, op2->in[w]) == in &&
                                    (op2->in[w] != in || !row_operand(g, op2, in) ||
                                     dm_arg_in(op2->kind, w) == DM_ARG_INDEXED)) /* gathered: any row */
                                    later = 1;
                        }
                        for (int q = k + self; q < gr->nops && !later; q++) {
                            const dm_op *op2 = &g->op[plan->order[gr->first + q]];
                            for (int w = 0; w < op2->nin; w++) later |= dm_tensor_root(g, op2->in[w]) == in;
                            for (int w = 0; w < op2->nout; w++) later |= dm_tensor_root(g, op2->out[w]) == in;
                        }
                        if (!taken && !later) alias[o] = in;
                    }
                }
            }
        }
    }
}

typedef struct {
    int t;
    int64_t first, last; /* group indices */
    size_t bytes;
    size_t off;
} live;

static int by_size_desc(const void *a, const void *b) {
    const live *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->t - y->t;
}

dm_status dm_plan_memory(dm_plan *plan, int no_reuse) {
    const dm_graph *g = plan->g;
    int nt = g->nt;
    free(plan->in_memory); /* planned again after a change of layouts */
    free(plan->offset);
    plan->in_memory = calloc((size_t)nt, 1);
    plan->offset = malloc(sizeof(int64_t) * (size_t)nt);
    int64_t *first = malloc(sizeof(int64_t) * (size_t)nt);
    int64_t *last = malloc(sizeof(int64_t) * (size_t)nt);
    int *owner = malloc(sizeof(int) * (size_t)nt); /* group that produces it, -1 none */
    int *alias = malloc(sizeof(int) * (size_t)nt); /* in place: the input whose bytes it takes */
    live *lv = malloc(sizeof(live) * (size_t)nt);
    dm_status st = DM_OK;
    if (!plan->in_memory || !plan->offset || !first || !last || !owner || !alias || !lv) {
        st = dm_fail(DM_ERR_OOM, "out of memory planning buffers");
        goto done;
    }
    for (int t = 0; t < nt; t++) {
        plan->offset[t] = -1;
        first[t] = INT64_MAX;
        last[t] = -1;
        owner[t] = -1;
        alias[t] = -1;
        if (g->t[t].base < 0 && g->t[t].role != DM_ROLE_ACT) plan->in_memory[t] = 1;
    }
    for (int G = 0; G < plan->ngroups; G++) {
        const dm_group *gr = &plan->groups[G];
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[plan->order[gr->first + k]];
            int contr = op->kind == DM_OP_CONTRACT || dm_op_alone(op->kind); /* its outputs: in memory */
            for (int s = 0; s < op->nout; s++) {
                int r = dm_tensor_root(g, op->out[s]);
                if (first[r] > G) first[r] = G;
                if (last[r] < G) last[r] = G;
                if (owner[r] >= 0 && owner[r] != G) plan->in_memory[r] = 1; /* several writers */
                owner[r] = G;
                if (contr && tileable(g, gr, r)) continue; /* decided by its readers */
                if (contr || g->t[r].numel != op->rows * op->cols) {
                    /* contraction results, column reductions and per-row statistics that
                     * leave the group are materialized; per-row stats used only inside
                     * stay in scratch (decided below by readers) */
                    if (contr || dm_arg_out(op->kind, s) == DM_ARG_COLACC)
                        plan->in_memory[r] = 1;
                }
                if (dm_arg_out(op->kind, s) == DM_ARG_SCATTER) plan->in_memory[r] = 1; /* a whole table */
            }
        }
    }
    for (int G = 0; G < plan->ngroups; G++) {
        const dm_group *gr = &plan->groups[G];
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[plan->order[gr->first + k]];
            for (int s = 0; s < op->nin; s++) {
                int r = dm_tensor_root(g, op->in[s]);
                if (last[r] < G) last[r] = G;
                if (first[r] > G) first[r] = G;
                if ((op->kind == DM_OP_CONTRACT && !tileable(g, gr, r)) || owner[r] != G ||
                    dm_arg_in(op->kind, s) == DM_ARG_INDEXED) /* a table gathered from */
                    plan->in_memory[r] = 1;
            }
        }
    }
    /* persistent tensors first, then activations by first-fit over live intervals */
    size_t off = 0;
    for (int t = 0; t < nt; t++) {
        if (!plan->in_memory[t] || g->t[t].role == DM_ROLE_ACT) continue;
        size_t bytes;
        if (!dm_mul_ok((size_t)g->t[t].numel, 4, &bytes) || !dm_add_ok(off, bytes, &off)) {
            st = dm_fail(DM_ERR_OOM, "tensor sizes overflow");
            goto done;
        }
        plan->offset[t] = (int64_t)(off - bytes);
        off = (off + ALIGN - 1) / ALIGN * ALIGN;
    }
    size_t base = off;
    /* in place: an alias is no block of its own; its chain's first tensor (placed) lives
     * until the chain's last one dies */
    if (!no_reuse) plan_in_place(plan, first, last, alias);
    for (int t = 0; t < nt; t++) {
        if (alias[t] < 0) continue;
        int h = t;
        while (alias[h] >= 0) h = alias[h];
        if (last[h] < last[t]) last[h] = last[t];
    }
    int nl = 0;
    for (int t = 0; t < nt; t++) {
        if (!plan->in_memory[t] || g->t[t].role != DM_ROLE_ACT || g->t[t].base >= 0 || alias[t] >= 0) continue;
        size_t bytes;
        if (!dm_mul_ok((size_t)g->t[t].numel, 4, &bytes)) {
            st = dm_fail(DM_ERR_OOM, "tensor sizes overflow");
            goto done;
        }
        bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
        lv[nl++] = (live){.t = t, .first = first[t], .last = last[t], .bytes = bytes};
    }
    qsort(lv, (size_t)nl, sizeof(live), by_size_desc);
    size_t top = 0;
    for (int a = 0; a < nl; a++) {
        size_t cand = 0;
        int moved = 1;
        while (moved) { /* lowest offset not overlapping any placed, time-overlapping block */
            moved = 0;
            for (int b = 0; b < a; b++) {
                if (!no_reuse && (lv[b].last < lv[a].first || lv[a].last < lv[b].first)) continue;
                if (cand < lv[b].off + lv[b].bytes && lv[b].off < cand + lv[a].bytes) {
                    cand = lv[b].off + lv[b].bytes;
                    moved = 1;
                }
            }
        }
        lv[a].off = cand;
        if (cand + lv[a].bytes > top) top = cand + lv[a].bytes;
        plan->offset[lv[a].t] = (int64_t)(base + cand);
    }
    for (int t = 0; t < nt; t++) {
        if (alias[t] < 0) continue;
        int h = t;
        while (alias[h] >= 0) h = alias[h];
        plan->offset[t] = plan->offset[h];
    }
    plan->activation_bytes = top;
    if (!dm_add_ok(base, top, &plan->arena_bytes)) st = dm_fail(DM_ERR_OOM, "arena size overflows");
done:
    free(first);
    free(last);
    free(owner);
    free(alias);
    free(lv);
    return st;
}
