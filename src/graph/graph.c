/* graph.c: tensors, views and operators of the dataflow graph, and their costs. */
#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

void dm_graph_init(dm_graph *g) { memset(g, 0, sizeof *g); }

void dm_graph_free(dm_graph *g) {
    free(g->t);
    free(g->op);
    memset(g, 0, sizeof *g);
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 1;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return 0;
    *p = q;
    *cap = nc;
    return 1;
}

static int new_tensor(dm_graph *g) {
    if (!grow((void **)&g->t, &g->cap_t, g->nt + 1, sizeof(dm_tensor))) {
        dm_fail(DM_ERR_OOM, "out of memory building the graph");
        return -1;
    }
    memset(&g->t[g->nt], 0, sizeof(dm_tensor));
    return g->nt++;
}

int dm_graph_tensor(dm_graph *g, const char *name, const char *letters, dm_role role) {
    int n = (int)strlen(letters);
    if (n < 1 || n > DM_MAX_DIMS) {
        dm_fail(DM_ERR_INTERNAL, "tensor %s: %d dimensions", name, n);
        return -1;
    }
    int id = new_tensor(g);
    if (id < 0) return -1;
    dm_tensor *t = &g->t[id];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = n;
    memcpy(t->letters, letters, (size_t)n + 1);
    int64_t s = 1;
    for (int d = n - 1; d >= 0; d--) {
        int64_t sz = g->dim[letters[d] - 'a'];
        if (sz <= 0) {
            dm_fail(DM_ERR_INTERNAL, "tensor %s: dimension %c has no size", name, letters[d]);
            g->nt--;
            return -1;
        }
        t->size[d] = sz;
        t->stride[d] = s;
        s *= sz;
    }
    t->numel = s;
    t->base = -1;
    t->role = role;
    return id;
}

int dm_graph_view(dm_graph *g, int base, const char *name, const char *map) {
    int id = new_tensor(g);
    if (id < 0) return -1;
    const dm_tensor *b = &g->t[base];
    dm_tensor *t = &g->t[id];
    if ((int)strlen(map) != b->ndim || b->base >= 0) {
        dm_fail(DM_ERR_INTERNAL, "view %s of %s: bad map '%s'", name, b->name, map);
        g->nt--;
        return -1;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    memcpy(t->vmap, map, strlen(map) + 1);
    t->base = base;
    t->role = b->role;
    t->numel = 1;
    for (int d = 0; d < b->ndim; d++) {
        if (map[d] >= '0' && map[d] <= '9') {
            t->offset += (map[d] - '0') * b->stride[d];
        } else {
            t->letters[t->ndim] = map[d];
            t->size[t->ndim] = b->size[d];
            t->stride[t->ndim] = b->stride[d];
            t->numel *= b->size[d];
            t->ndim++;
        }
    }
    t->letters[t->ndim] = 0;
    return id;
}

/* Recomputes view v's offset and strides from its root's current strides. */
static void refresh_view(dm_graph *g, int v) {
    dm_tensor *t = &g->t[v];
    const dm_tensor *b = &g->t[t->base];
    t->offset = 0;
    int n = 0;
    for (int d = 0; d < b->ndim; d++) {
        char m = t->vmap[d];
        if (m >= '0' && m <= '9') t->offset += (m - '0') * b->stride[d];
        else t->stride[n++] = b->stride[d];
    }
}

dm_status dm_graph_set_layout(dm_graph *g, int t, const char *layout) {
    if (t < 0 || t >= g->nt || g->t[t].base >= 0)
        return dm_fail(DM_ERR_INTERNAL, "layout of tensor %d: not a root tensor", t);
    dm_tensor *r = &g->t[t];
    int n = r->ndim;
    if (!layout || (int)strlen(layout) != n)
        return dm_fail(DM_ERR_INVALID_ARG, "layout '%s' of %s: give all %d letters of '%s' in memory order",
                       layout ? layout : "(null)", r->name, n, r->letters);
    int used[DM_MAX_DIMS] = {0};
    for (int k = 0; k < n; k++) {
        const char *c = strchr(r->letters, layout[k]);
        if (!c || !layout[k] || used[c - r->letters]++)
            return dm_fail(DM_ERR_INVALID_ARG, "layout '%s' of %s is not a permutation of '%s'",
                           layout, r->name, r->letters);
    }
    int64_t s = 1;
    for (int k = n - 1; k >= 0; k--) {
        int d = (int)(strchr(r->letters, layout[k]) - r->letters);
        r->stride[d] = s;
        s *= r->size[d];
    }
    for (int v = 0; v < g->nt; v++)
        if (g->t[v].base == t && g->t[v].vmap[0]) refresh_view(g, v);
    return DM_OK;
}

void dm_tensor_layout(const dm_graph *g, int t, char *out) {
    const dm_tensor *x = &g->t[t];
    int idx[DM_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) idx[d] = d;
    /* insertion sort by stride, descending; stable, so ties keep the logical order */
    for (int a = 1; a < x->ndim; a++)
        for (int b = a; b > 0 && x->stride[idx[b]] > x->stride[idx[b - 1]]; b--) {
            int tmp = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = tmp;
        }
    for (int d = 0; d < x->ndim; d++) out[d] = x->letters[idx[d]];
    out[x->ndim] = 0;
}

int dm_graph_clone(dm_graph *g, int src) {
    int id = new_tensor(g);
    if (id >= 0) g->t[id] = g->t[src];
    return id;
}

int dm_tensor_root(const dm_graph *g, int t) { return g->t[t].base >= 0 ? g->t[t].base : t; }

int dm_graph_op(dm_graph *g, const dm_op *op) {
    if ((unsigned)op->kind >= DM_NUM_OPS) {
        dm_fail(DM_ERR_INTERNAL, "op %s: kind %d is not a row of ops.def", op->name, (int)op->kind);
        return -1;
    }
    if (op->nin != dm_op_nin(op->kind) || op->nout != dm_op_nout(op->kind)) {
        dm_fail(DM_ERR_INTERNAL, "op %s: a %s takes %d inputs and %d outputs (ops.def), not %d and %d", op->name,
                dm_op_kind_name(op->kind), dm_op_nin(op->kind), dm_op_nout(op->kind), op->nin, op->nout);
        return -1;
    }
    if (dm_op_indexed(op->kind)) { /* the table: N rows of the op's columns */
        int tab = dm_arg_in(op->kind, 0) == DM_ARG_INDEXED ? op->in[0] : op->out[0];
        int ix = op->in[dm_op_index_slot(op->kind)];
        int64_t want;
        if (op->nindex < 1 || op->cols < 1 || __builtin_mul_overflow(op->nindex, op->cols, &want) ||
            tab < 0 || tab >= g->nt || ix < 0 || ix >= g->nt || g->t[tab].numel != want ||
            g->t[ix].numel != op->rows) {
            dm_fail(DM_ERR_INTERNAL, "op %s: a %s needs a table of nindex x cols = %lld x %lld elements and "
                    "one index per row (%lld)", op->name, dm_op_kind_name(op->kind), (long long)op->nindex,
                    (long long)op->cols, (long long)op->rows);
            return -1;
        }
    }
    if (!grow((void **)&g->op, &g->cap_op, g->nop + 1, sizeof(dm_op))) {
        dm_fail(DM_ERR_OOM, "out of memory building the graph");
        return -1;
    }
    g->op[g->nop] = *op;
    return g->nop++;
}

/* Product of the sizes of every distinct letter in the einsum spec. */
static double spec_volume(const dm_graph *g, const char *spec) {
    int seen[26] = {0};
    double v = 1;
    for (const char *c = spec; *c; c++) {
        if (*c >= 'a' && *c <= 'z' && !seen[*c - 'a']) {
            seen[*c - 'a'] = 1;
            v *= (double)g->dim[*c - 'a'];
        }
    }
    return v;
}

void dm_op_row_flop_classes(const dm_op *op, double flop[DM_NUM_CLASSES]) {
    dm_op_kind k[3] = {DM_NUM_OPS, DM_NUM_OPS, DM_NUM_OPS}; /* the row ops it does, per element */
    switch (op->kind) {
    case DM_OP_ATTN: /* per score: the mask, the softmax, the dropout */
        k[0] = DM_OP_MASK_ADD, k[1] = DM_OP_SOFTMAX, k[2] = DM_OP_DROPOUT;
        break;
    case DM_OP_ATTN_BWD: /* the dropout again, its backward, the softmax's */
        k[0] = DM_OP_DROPOUT, k[1] = DM_OP_DROPOUT_BWD, k[2] = DM_OP_SOFTMAX_BWD;
        break;
    case DM_OP_LINEAR_XENT: k[0] = DM_OP_XENT; break;
    case DM_OP_LINEAR_XENT_BWD: k[0] = DM_OP_XENT_BWD, k[1] = DM_OP_COLSUM; break;
    default: break;
    }
    for (int q = 0; q < 3; q++)
        if (k[q] != DM_NUM_OPS)
            flop[dm_op_kind_class(k[q])] += dm_op_kind_flop(k[q]) * (double)op->rows * (double)op->cols;
}

double dm_op_row_flop(const dm_op *op) {
    double f[DM_NUM_CLASSES] = {0};
    dm_op_row_flop_classes(op, f);
    double s = 0;
    for (int c = 0; c < DM_NUM_CLASSES; c++) s += f[c];
    return s;
}

double dm_op_flop(const dm_graph *g, const dm_op *op) {
    if (dm_op_kind_class(op->kind) == DM_CLASS_CONTRACTION)
        return dm_op_kind_flop(op->kind) * spec_volume(g, op->spec) + dm_op_row_flop(op);
    return dm_op_kind_flop(op->kind) * (double)op->rows * (double)op->cols;
}

double dm_op_moves(const dm_graph *g, const dm_op *op, int io, int slot) {
    if (!io && dm_arg_in(op->kind, slot) == DM_ARG_INDEXED) return (double)op->rows * (double)op->cols;
    return (double)g->t[io ? op->out[slot] : op->in[slot]].numel;
}

double dm_op_bytes(const dm_graph *g, const dm_op *op) {
    double b = 0;
    for (int i = 0; i < op->nin; i++) b += dm_op_moves(g, op, 0, i) * 4.0;
    for (int i = 0; i < op->nout; i++) b += dm_op_moves(g, op, 1, i) * 4.0;
    return b;
}
