/* autodiff.c: derives the backward graph from the forward one by per-operator gradient
 * rules. Gradients flowing through identity-like edges (bias add, residual add, mask add)
 * are aliases, not copies; a tensor reached by several paths gets an ADD of its parts
 * (a parameter too: tied weights, whose sum keeps the name d_<param>);
 * gradients of views (the Q/K/V slices of the stacked projection) are written straight
 * into the matching slices of one stacked gradient. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "graph/graph.h"

typedef struct {
    dm_graph *g;
    int *grad;    /* tensor id -> gradient tensor id, or -1 */
    int nfwd_t;   /* tensors that existed before autodiff */
} ad_ctx;

static int grad_of(ad_ctx *c, int t) { return t < c->nfwd_t ? c->grad[t] : -1; }

/* Gradient tensor with the letters of t: for a root a new root, for a view the matching
 * view of the root's gradient (created on first use). */
static int grad_slot(ad_ctx *c, int t) {
    dm_graph *g = c->g;
    char name[DM_NAME_LEN];
    snprintf(name, sizeof name, "d_%s", g->t[t].name);
    if (g->t[t].base < 0 || grad_of(c, t) >= 0) {
        char letters[DM_MAX_DIMS + 1];
        memcpy(letters, g->t[t].letters, sizeof letters);
        dm_role role = g->t[t].role == DM_ROLE_PARAM ? DM_ROLE_PARAM_GRAD : DM_ROLE_ACT;
        if (grad_of(c, t) >= 0) { /* a second contribution: a temporary, summed below */
            snprintf(name, sizeof name, "d_%s_part", g->t[t].name);
            role = DM_ROLE_ACT;
        }
        int id = dm_graph_tensor(g, name, letters, role);
        if (id >= 0) g->t[id].pass = 1;
        return id;
    }
    int base = g->t[t].base;
    if (c->grad[base] < 0) {
        char bname[DM_NAME_LEN], bl[DM_MAX_DIMS + 1];
        snprintf(bname, sizeof bname, "d_%s", g->t[base].name);
        memcpy(bl, g->t[base].letters, sizeof bl);
        dm_role role = g->t[base].role == DM_ROLE_PARAM ? DM_ROLE_PARAM_GRAD : DM_ROLE_ACT;
        int gb = dm_graph_tensor(g, bname, bl, role);
        if (gb < 0) return -1;
        g->t[gb].pass = 1;
        c->grad[base] = gb;
    }
    int gb = c->grad[base];
    int id = dm_graph_clone(g, t);
    if (id < 0) return -1;
    dm_tensor *v = &g->t[id];
    *v = g->t[t];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->base = gb;
    v->role = g->t[gb].role;
    v->pass = 1;
    return id;
}

/* Record that gradient tensor gt (just written by an op) is (a part of) the gradient of t. */
static dm_status grad_add(ad_ctx *c, int t, int gt) {
    dm_graph *g = c->g;
    int old = grad_of(c, t);
    if (old < 0) {
        c->grad[t] = gt;
        return DM_OK;
    }
    if (g->t[t].base >= 0)
        return dm_fail(DM_ERR_INTERNAL, "autodiff: view %s reached twice (%d, %d)", g->t[t].name, old, gt);
    char name[DM_NAME_LEN];
    snprintf(name, sizeof name, "d_%s_sum", g->t[t].name);
    dm_role role = DM_ROLE_ACT;
    if (g->t[t].role == DM_ROLE_PARAM) {
        /* a tied parameter (the word embeddings and the MLM decoder): its gradient is the
         * sum of its parts, and keeps the name d_<param> the exports look for */
        int views = g->t[old].base >= 0;
        for (int v = 0; v < g->nt; v++) views |= g->t[v].base == old;
        if (views)
            return dm_fail(DM_ERR_UNSUPPORTED, "autodiff: parameter %s is used by two operators "
                           "and its gradient has views (accumulating it is not supported)", g->t[t].name);
        char part[DM_NAME_LEN];
        snprintf(part, sizeof part, "d_%.30s_part%d", g->t[t].name, g->nt);
        memcpy(g->t[old].name, part, sizeof part);
        g->t[old].role = DM_ROLE_ACT;
        snprintf(name, sizeof name, "d_%s", g->t[t].name);
        role = DM_ROLE_PARAM_GRAD;
    }
    char letters[DM_MAX_DIMS + 1];
    memcpy(letters, g->t[t].letters, sizeof letters); /* g->t may move */
    int sum = dm_graph_tensor(g, name, letters, role);
    if (sum < 0) return dm_last_status();
    g->t[sum].pass = 1;
    dm_op op = {.kind = DM_OP_ADD, .pass = 1, .nin = 2, .nout = 1};
    snprintf(op.name, sizeof op.name, "grad_acc_%s", g->t[t].name);
    op.in[0] = old;
    op.in[1] = gt;
    op.out[0] = sum;
    op.cols = g->t[t].size[g->t[t].ndim - 1];
    op.rows = g->t[t].numel / op.cols;
    if (dm_graph_op(g, &op) < 0) return dm_last_status();
    c->grad[t] = sum;
    return DM_OK;
}

/* The operand letter strings of "a,b->c" (rule() builds dA = "c,b->a", dB = "a,c->b"). */
static void split_spec(const char *spec, char a[16], char b[16], char o[16]) {
    sscanf(spec, "%15[a-z],%15[a-z]->%15[a-z]", a, b, o);
}

static dm_status emit(ad_ctx *c, const dm_op *op) {
    return dm_graph_op(c->g, op) < 0 ? dm_last_status() : DM_OK;
}

/* The backward of a fused op whose first three inputs take gradients (LINEAR_XENT,
 * ATTN): one op `kind` (in: the forward's four inputs, its second output, dy; out: the
 * three gradients; the forward's einsum, scale and causal flag) writes all three, an input
 * that takes no gradient getting a temporary. */
static dm_status rule_fused_bwd(ad_ctx *c, const dm_op *f, const dm_op *proto, int dy, dm_op_kind kind) {
    dm_graph *g = c->g;
    int slot[3];
    for (int i = 0; i < 3; i++) {
        slot[i] = grad_slot(c, f->in[i]);
        if (slot[i] < 0) return dm_last_status();
    }
    dm_op m = *proto;
    m.kind = kind;
    snprintf(m.spec, sizeof m.spec, "%s", f->spec);
    m.alpha = f->alpha;
    m.causal = f->causal;
    m.keymask = f->keymask;
    m.nin = 6;
    for (int i = 0; i < 4; i++) m.in[i] = f->in[i];
    m.in[4] = f->out[1];
    m.in[5] = dy;
    if (kind == DM_OP_ATTN_BWD) { /* and the context, whose rows' sums with dy the flash backward takes */
        m.nin = 7;
        m.in[6] = f->out[0];
    }
    m.nout = 3;
    for (int i = 0; i < 3; i++) m.out[i] = slot[i];
    snprintf(m.name, sizeof m.name, "%s_bwd", f->name);
    DM_TRY(emit(c, &m));
    for (int i = 0; i < 3; i++)
        if (g->t[f->in[i]].requires_grad) DM_TRY(grad_add(c, f->in[i], slot[i]));
    return DM_OK;
}

/* The whole model's kinds: a gather's table gets the scatter-add of dy by the same
 * indices; the cross-entropy's logits get dloss * (softmax - onehot) from the logsumexp
 * it kept; the fused decoder and cross-entropy's t, W and bias get theirs from one
 * LINEAR_XENT_BWD, the unpadded attention's Q, K, V from one ATTN_BWD. Index operands (ids,
 * labels, lengths) take no gradient. */
static dm_status rule_model(ad_ctx *c, const dm_op *f, const dm_op *proto, int dy) {
    dm_graph *g = c->g;
    const dm_op b = *proto;
    switch (f->kind) {
    case DM_OP_EMBED: { /* in: table, idx; the indices take no gradient */
        int tab = f->in[0];
        if (!g->t[tab].requires_grad) return DM_OK;
        int slot = grad_slot(c, tab);
        if (slot < 0) return dm_last_status();
        dm_op m = b;
        m.kind = DM_OP_EMBED_BWD;
        m.nin = 2;
        m.in[0] = dy;
        m.in[1] = f->in[1];
        m.nout = 1;
        m.out[0] = slot;
        snprintf(m.name, sizeof m.name, "%s_bwd", f->name);
        DM_TRY(emit(c, &m));
        return grad_add(c, tab, slot);
    }
    case DM_OP_XENT: { /* in: logits, labels; out: loss, lse (lse takes no gradient) */
        if (grad_of(c, f->out[1]) >= 0)
            return dm_fail(DM_ERR_UNSUPPORTED, "autodiff: %s: a gradient flows into the logsumexp it keeps "
                           "for the backward (only the loss is differentiable)", f->name);
        int x = f->in[0];
        if (!g->t[x].requires_grad) return DM_OK;
        int slot = grad_slot(c, x);
        if (slot < 0) return dm_last_status();
        dm_op m = b;
        m.kind = DM_OP_XENT_BWD;
        m.nin = 4;
        m.in[0] = x;
        m.in[1] = f->out[1];
        m.in[2] = f->in[1];
        m.in[3] = dy;
        m.nout = 1;
        m.out[0] = slot;
        snprintf(m.name, sizeof m.name, "%s_bwd", f->name);
        DM_TRY(emit(c, &m));
        return grad_add(c, x, slot);
    }
    case DM_OP_LINEAR_XENT: /* in: t, W, bias, labels; out: loss, lse, pred (no gradient) */
        if (grad_of(c, f->out[1]) >= 0 || grad_of(c, f->out[2]) >= 0)
            return dm_fail(DM_ERR_UNSUPPORTED, "autodiff: %s: a gradient flows into the logsumexp or the "
                           "predictions (only the loss is differentiable)", f->name);
        return rule_fused_bwd(c, f, proto, dy, DM_OP_LINEAR_XENT_BWD);
    case DM_OP_ATTN: /* in: Q, K, V, lengths; out: ctx, probs (kept, no gradient) */
        if (grad_of(c, f->out[1]) >= 0)
            return dm_fail(DM_ERR_UNSUPPORTED, "autodiff: %s: a gradient flows into the probabilities it keeps "
                           "for the backward (only the context is differentiable)", f->name);
        return rule_fused_bwd(c, f, proto, dy, DM_OP_ATTN_BWD);
    default:
        return dm_fail(DM_ERR_INTERNAL, "autodiff: %s is no kind of the whole model", dm_op_kind_name(f->kind));
    }
}

static dm_status rule(ad_ctx *c, const dm_op *f) {
    dm_graph *g = c->g;
    int dy = grad_of(c, f->out[0]);
    if (dy < 0) return DM_OK; /* nothing flows back through this op */
    dm_op b = {.pass = 1, .rows = f->rows, .cols = f->cols, .stream = f->stream, .p = f->p,
               .eps = f->eps, .act = f->act, .nindex = f->nindex};
    switch (f->kind) {
    case DM_OP_CONTRACT: {
        char sa[16], sb[16], so[16];
        split_spec(f->spec, sa, sb, so);
        for (int side = 0; side < 2; side++) {
            int x = f->in[side];
            if (!g->t[x].requires_grad) continue;
            int slot = grad_slot(c, x);
            if (slot < 0) return dm_last_status();
            dm_op m = b;
            m.kind = DM_OP_CONTRACT;
            m.alpha = f->alpha;
            m.nin = 2;
            m.nout = 1;
            if (side == 0) {
                snprintf(m.spec, sizeof m.spec, "%s,%s->%s", so, sb, sa);
                m.in[0] = dy;
                m.in[1] = f->in[1];
                snprintf(m.name, sizeof m.name, "%s_dA", f->name);
            } else {
                snprintf(m.spec, sizeof m.spec, "%s,%s->%s", sa, so, sb);
                m.in[0] = f->in[0];
                m.in[1] = dy;
                snprintf(m.name, sizeof m.name, "%s_dB", f->name);
            }
            m.out[0] = slot;
            DM_TRY(emit(c, &m));
            DM_TRY(grad_add(c, x, slot));
        }
        return DM_OK;
    }
    case DM_OP_BIAS_ADD: {
        int bias = f->in[1];
        if (g->t[bias].requires_grad) {
            int slot = grad_slot(c, bias);
            if (slot < 0) return dm_last_status();
            dm_op m = b;
            m.kind = DM_OP_COLSUM;
            m.nin = 1;
            m.nout = 1;
            m.in[0] = dy;
            m.out[0] = slot;
            snprintf(m.name, sizeof m.name, "%s_dbias", f->name);
            DM_TRY(emit(c, &m));
            DM_TRY(grad_add(c, bias, slot));
        }
        if (g->t[f->in[0]].requires_grad) DM_TRY(grad_add(c, f->in[0], dy));
        return DM_OK;
    }
    case DM_OP_ADD:
        for (int i = 0; i < 2; i++)
            if (g->t[f->in[i]].requires_grad) DM_TRY(grad_add(c, f->in[i], dy));
        return DM_OK;
    case DM_OP_MASK_ADD:
        if (g->t[f->in[0]].requires_grad) DM_TRY(grad_add(c, f->in[0], dy));
        return DM_OK;
    case DM_OP_SOFTMAX:
    case DM_OP_DROPOUT:
    case DM_OP_ACT: {
        int x = f->in[0];
        if (!g->t[x].requires_grad) return DM_OK;
        int slot = grad_slot(c, x);
        if (slot < 0) return dm_last_status();
        dm_op m = b;
        m.nout = 1;
        m.out[0] = slot;
        m.in[0] = dy;
        if (f->kind == DM_OP_SOFTMAX) {
            m.kind = DM_OP_SOFTMAX_BWD;
            m.nin = 2;
            m.in[1] = f->out[0]; /* y */
        } else if (f->kind == DM_OP_DROPOUT) {
            m.kind = DM_OP_DROPOUT_BWD;
            m.nin = 1;
        } else {
            m.kind = DM_OP_ACT_BWD;
            m.nin = 2;
            m.in[1] = x;
        }
        snprintf(m.name, sizeof m.name, "%s_bwd", f->name);
        DM_TRY(emit(c, &m));
        return grad_add(c, x, slot);
    }
    case DM_OP_LAYERNORM: {
        /* in: x, gamma, beta; out: y, mean, rstd */
        int x = f->in[0], gm = f->in[1], bt = f->in[2];
        int dx = grad_slot(c, x), dg = grad_slot(c, gm), db = grad_slot(c, bt);
        if (dx < 0 || dg < 0 || db < 0) return dm_last_status();
        dm_op m = b;
        m.kind = DM_OP_LAYERNORM_BWD;
        m.nin = 5;
        m.in[0] = dy;
        m.in[1] = x;
        m.in[2] = f->out[1];
        m.in[3] = f->out[2];
        m.in[4] = gm;
        m.nout = 3;
        m.out[0] = dx;
        m.out[1] = dg;
        m.out[2] = db;
        snprintf(m.name, sizeof m.name, "%s_bwd", f->name);
        DM_TRY(emit(c, &m));
        DM_TRY(grad_add(c, x, dx));
        DM_TRY(grad_add(c, gm, dg));
        return grad_add(c, bt, db);
    }
    case DM_OP_EMBED:
    case DM_OP_XENT:
    case DM_OP_LINEAR_XENT:
    case DM_OP_ATTN:
        return rule_model(c, f, &b, dy);
    default:
        return dm_fail(DM_ERR_INTERNAL, "autodiff: no gradient rule for %s",
                       dm_op_kind_name(f->kind));
    }
}

dm_status dm_autodiff(dm_graph *g, int y, int dy, int x, int *dx_out) {
    int nfwd_op = g->nop;
    /* requires_grad flows forward from parameters and the input x (if any) */
    for (int i = 0; i < g->nt; i++)
        g->t[i].requires_grad = g->t[i].role == DM_ROLE_PARAM || i == x;
    for (int i = 0; i < g->nt; i++)
        if (g->t[i].base >= 0 && g->t[g->t[i].base].requires_grad) g->t[i].requires_grad = 1;
    for (int o = 0; o < nfwd_op; o++) {
        int rg = 0;
        for (int i = 0; i < g->op[o].nin; i++) rg |= g->t[g->op[o].in[i]].requires_grad;
        for (int i = 0; i < g->op[o].nout; i++) {
            int t = g->op[o].out[i];
            g->t[t].requires_grad = rg;
            /* views of this output inherit */
            for (int v = 0; v < g->nt; v++)
                if (g->t[v].base == t) g->t[v].requires_grad = rg;
        }
    }
    ad_ctx c = {.g = g, .nfwd_t = g->nt};
    c.grad = malloc(sizeof(int) * (size_t)g->nt);
    if (!c.grad) return dm_fail(DM_ERR_OOM, "out of memory in autodiff");
    for (int i = 0; i < g->nt; i++) c.grad[i] = -1;
    c.grad[y] = dy;
    dm_status s = DM_OK;
    for (int o = nfwd_op - 1; o >= 0 && s == DM_OK; o--) {
        dm_op f = g->op[o]; /* copy: emitting may move g->op */
        /* a root written through views gets its gradient from the views' gradients */
        s = rule(&c, &f);
        /* after the consumers of a view's root are done, views inherit nothing more */
    }
    if (s == DM_OK) {
        *dx_out = x >= 0 ? c.grad[x] : -1;
        if (x >= 0 && *dx_out < 0) s = dm_fail(DM_ERR_INTERNAL, "autodiff: no gradient reaches the input");
    }
    free(c.grad);
    return s;
}
