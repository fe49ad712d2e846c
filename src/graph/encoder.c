/* encoder.c: builds the forward graph of one BERT encoder layer and derives its backward.
 *
 * Letters: b batch, j query position, k key position (= j), h heads, p head size,
 * i hidden, u FFN width, q the stacked Q/K/V index (3).
 *   qkv   (b,j,q,h,p) = X (b,j,i) . Wqkv (q,h,p,i) + bqkv (q,h,p)   one stacked GEMM
 *   s     (b,h,j,k)   = Q . K / sqrt(p) + mask;  a = dropout(softmax_k(s))
 *   ctx   (b,j,h,p)   = a . V                    (heads concatenated by the layout)
 *   h1    (b,j,i)     = LN(dropout(ctx . Wo + bo) + X)
 *   y     (b,j,i)     = LN(dropout(act(h1 . W1 + b1) . W2 + b2) + h1)
 * That is post-LN (BERT). Pre-LN (cfg->norm = DM_NORM_PRE) normalizes the inputs of the
 * two blocks instead and lets the residuals bypass the LayerNorms:
 *   qkv = LN1(X) . Wqkv + bqkv;  h1 = dropout(ctx . Wo + bo) + X
 *   y   = dropout(act(LN2(h1) . W1 + b1) . W2 + b2) + h1
 * (LN1 = attention.output.LayerNorm, LN2 = output.LayerNorm.) A causal layer
 * (cfg->causal) adds the lowest value to the scores of keys after the query, as it does
 * for padded keys. Only the forward graph knows any of this: autodiff derives the rest.
 * Weights keep torch.nn.Linear's (out, in) layout, so Hugging Face checkpoints load as is;
 * the three projection weights are slices of one (q,h,p,i) tensor. */
#include "graph/encoder.h"
#include "graph/build.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "core/philox.h"

const char *const dm_param_names[DM_NUM_PARAMS] = {
    "attention.self.query.weight",    "attention.self.query.bias",
    "attention.self.key.weight",      "attention.self.key.bias",
    "attention.self.value.weight",    "attention.self.value.bias",
    "attention.output.dense.weight",  "attention.output.dense.bias",
    "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",      "intermediate.dense.bias",
    "output.dense.weight",            "output.dense.bias",
    "output.LayerNorm.weight",        "output.LayerNorm.bias",
};

#define D(c) g->dim[(c) - 'a']
#define pw dm_gb_pw
#define mm dm_gb_mm
#define export dm_gb_export

static int ck_(int v, int *ok) {
    if (v < 0) *ok = 0;
    return v < 0 ? 0 : v;
}

static int T(dm_graph *g, const char *name, const char *letters, dm_role role) {
    return dm_graph_tensor(g, name, letters, role);
}

/* Appends a pointwise-family op over (rows, cols) = (numel / cols, cols) of `space`. */
int dm_gb_pw(dm_graph *g, dm_op_kind kind, const char *name, int space, int64_t cols,
              const int *in, int nin, const int *out, int nout) {
    dm_op op = {.kind = kind, .nin = nin, .nout = nout, .cols = cols};
    snprintf(op.name, sizeof op.name, "%s", name);
    op.rows = g->t[space].numel / cols;
    memcpy(op.in, in, sizeof(int) * (size_t)nin);
    memcpy(op.out, out, sizeof(int) * (size_t)nout);
    return dm_graph_op(g, &op);
}

int dm_gb_mm(dm_graph *g, const char *name, const char *spec, int a, int b, int c, float alpha) {
    dm_op op = {.kind = DM_OP_CONTRACT, .nin = 2, .nout = 1, .alpha = alpha};
    snprintf(op.name, sizeof op.name, "%s", name);
    snprintf(op.spec, sizeof op.spec, "%s", spec);
    op.in[0] = a;
    op.in[1] = b;
    op.out[0] = c;
    return dm_graph_op(g, &op);
}

void dm_gb_export(dm_encoder *e, const char *name, int tensor, int ndim, int64_t s0, int64_t s1, int64_t s2,
                  int is_param) {
    dm_export *x = &e->e[e->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->tensor = tensor;
    x->ndim = ndim;
    x->shape[0] = s0;
    x->shape[1] = s1;
    x->shape[2] = s2;
    x->is_param = is_param;
}

/* The tensor ids of one layer's forward graph, made in this order. */
typedef struct {
    /* inputs and parameters */
    int x, mask, wqkv, bqkv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2;
    /* attention */
    int qkv_mm, qkv, Q, K, V, s, sm, a, ad, ctx, att_mm, att, attd, r1, h1, mu1, rs1;
    /* feed-forward */
    int f1_mm, f1, act, f2_mm, f2, f2d, r2, y, mu2, rs2;
} enc_tensors;

/* *ok becomes 0 (and stays 0) when a tensor or an op cannot be made; the builder then
 * returns the status that failure recorded (dm_last_status: out of memory, or an op
 * that ops.def refuses). */
#define CK(x) ck_(x, ok)
#define IN(...) ((const int[]){__VA_ARGS__})

static void add_inputs_and_params(dm_graph *g, int unpad, enc_tensors *ts, int *ok) {
    ts->x = CK(T(g, "hidden_states", "bji", DM_ROLE_INPUT));
    /* unpadded: the sequences' lengths (ATTN) instead of the mask */
    ts->mask = CK(T(g, unpad ? "seq_lengths" : "attention_mask", unpad ? "b" : "bk", DM_ROLE_INPUT));
    ts->wqkv = CK(T(g, "Wqkv", "qhpi", DM_ROLE_PARAM));
    ts->bqkv = CK(T(g, "bqkv", "qhp", DM_ROLE_PARAM));
    ts->wo = CK(T(g, "Wo", "ihp", DM_ROLE_PARAM));
    ts->bo = CK(T(g, "bo", "i", DM_ROLE_PARAM));
    ts->g1 = CK(T(g, "ln1_gamma", "i", DM_ROLE_PARAM));
    ts->be1 = CK(T(g, "ln1_beta", "i", DM_ROLE_PARAM));
    ts->w1 = CK(T(g, "W1", "ui", DM_ROLE_PARAM));
    ts->b1 = CK(T(g, "b1", "u", DM_ROLE_PARAM));
    ts->w2 = CK(T(g, "W2", "iu", DM_ROLE_PARAM));
    ts->b2 = CK(T(g, "b2", "i", DM_ROLE_PARAM));
    ts->g2 = CK(T(g, "ln2_gamma", "i", DM_ROLE_PARAM));
    ts->be2 = CK(T(g, "ln2_beta", "i", DM_ROLE_PARAM));
}

static void add_activations(dm_graph *g, int pre, int unpad, int attn_op, enc_tensors *ts, int *ok) {
    /* attention (unpadded, or as one ATTN op: Q, K, V over the same rows, one "bjhp"
     * letter set, and the probabilities alone) */
    ts->qkv_mm = CK(T(g, "qkv_mm", "bjqhp", DM_ROLE_ACT));
    ts->qkv = CK(T(g, "qkv", "bjqhp", DM_ROLE_ACT));
    ts->Q = CK(dm_graph_view(g, ts->qkv, "Q", "bj0hp"));
    ts->K = CK(dm_graph_view(g, ts->qkv, "K", unpad || attn_op ? "bj1hp" : "bk1hp"));
    ts->V = CK(dm_graph_view(g, ts->qkv, "V", unpad || attn_op ? "bj2hp" : "bk2hp"));
    if (unpad || attn_op) {
        ts->s = ts->sm = ts->ad = -1;
        ts->a = CK(T(g, "probs", "bhjk", DM_ROLE_ACT));
    } else {
        ts->s = CK(T(g, "scores", "bhjk", DM_ROLE_ACT));
        ts->sm = CK(T(g, "scores_masked", "bhjk", DM_ROLE_ACT));
        ts->a = CK(T(g, "probs", "bhjk", DM_ROLE_ACT));
        ts->ad = CK(T(g, "probs_drop", "bhjk", DM_ROLE_ACT));
    }
    ts->ctx = CK(T(g, "ctx", "bjhp", DM_ROLE_ACT));
    ts->att_mm = CK(T(g, "attn_mm", "bji", DM_ROLE_ACT));
    ts->att = CK(T(g, "attn", "bji", DM_ROLE_ACT));
    ts->attd = CK(T(g, "attn_drop", "bji", DM_ROLE_ACT));
    /* post-LN: resid1 = attn_drop + X, h1 = LN1(resid1); pre-LN: ln1_out = LN1(X),
     * h1 = attn_drop + X */
    ts->r1 = CK(T(g, pre ? "ln1_out" : "resid1", "bji", DM_ROLE_ACT));
    ts->h1 = CK(T(g, "h1", "bji", DM_ROLE_ACT));
    ts->mu1 = CK(T(g, "ln1_mean", "bj", DM_ROLE_ACT));
    ts->rs1 = CK(T(g, "ln1_rstd", "bj", DM_ROLE_ACT));
    /* feed-forward */
    ts->f1_mm = CK(T(g, "ffn1_mm", "bju", DM_ROLE_ACT));
    ts->f1 = CK(T(g, "ffn1", "bju", DM_ROLE_ACT));
    ts->act = CK(T(g, "ffn_act", "bju", DM_ROLE_ACT));
    ts->f2_mm = CK(T(g, "ffn2_mm", "bji", DM_ROLE_ACT));
    ts->f2 = CK(T(g, "ffn2", "bji", DM_ROLE_ACT));
    ts->f2d = CK(T(g, "ffn2_drop", "bji", DM_ROLE_ACT));
    /* post-LN: resid2 = ffn2_drop + h1, output = LN2(resid2); pre-LN: ln2_out = LN2(h1),
     * output = ffn2_drop + h1 */
    ts->r2 = CK(T(g, pre ? "ln2_out" : "resid2", "bji", DM_ROLE_ACT));
    ts->y = CK(T(g, "output", "bji", DM_ROLE_OUTPUT));
    ts->mu2 = CK(T(g, "ln2_mean", "bj", DM_ROLE_ACT));
    ts->rs2 = CK(T(g, "ln2_rstd", "bj", DM_ROLE_ACT));
}

/* The attention block's ops up to its residual add, and the LayerNorm after that add:
 * post-LN, LN1 of the sum; pre-LN, LN2 of the feed-forward block's input (pre-LN also
 * starts with LN1 of X). */
static void add_attention_ops(dm_graph *g, const dm_layer_config *cfg, int pre, int unpad, int attn_op,
                              const enc_tensors *ts, int *ok) {
    const int64_t J = cfg->seq, I = cfg->hidden;
    const int x = ts->x, mask = ts->mask, wqkv = ts->wqkv, bqkv = ts->bqkv, wo = ts->wo,
              bo = ts->bo, g1 = ts->g1, be1 = ts->be1, g2 = ts->g2, be2 = ts->be2;
    const int qkv_mm = ts->qkv_mm, qkv = ts->qkv, Q = ts->Q, K = ts->K, V = ts->V, s = ts->s,
              sm = ts->sm, a = ts->a, ad = ts->ad, ctx = ts->ctx, att_mm = ts->att_mm,
              att = ts->att, attd = ts->attd, r1 = ts->r1, h1 = ts->h1, mu1 = ts->mu1,
              rs1 = ts->rs1, r2 = ts->r2, mu2 = ts->mu2, rs2 = ts->rs2;
    float scale = (float)(1.0 / sqrt((double)D('p')));
    int oln;
    if (pre) {
        oln = CK(pw(g, DM_OP_LAYERNORM, "attn_layernorm", x, I, IN(x, g1, be1), 3, IN(r1, mu1, rs1), 3));
        if (*ok) g->op[oln].eps = cfg->eps;
    }
    CK(mm(g, "qkv_proj", "bji,qhpi->bjqhp", pre ? r1 : x, wqkv, qkv_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "qkv_bias", qkv, 3 * I, IN(qkv_mm, bqkv), 2, IN(qkv), 1));
    int od;
    if (unpad || attn_op) { /* scores, mask, softmax, dropout and context in one op (ops.def) */
        dm_op op = {.kind = DM_OP_ATTN, .nin = 4, .nout = 2, .alpha = scale, .rows = g->t[a].numel / J,
                    .cols = J, .nindex = D('p'), .stream = DM_DROP_ATTN_PROBS, .causal = cfg->causal != 0,
                    .keymask = !unpad, .in = {Q, K, V, mask}, .out = {ctx, a}};
        snprintf(op.name, sizeof op.name, "attn");
        snprintf(op.spec, sizeof op.spec, "bjhp,bkhp->bhjk");
        CK(dm_graph_op(g, &op));
    } else {
        CK(mm(g, "attn_scores", "bjhp,bkhp->bhjk", Q, K, s, scale));
        int om = CK(pw(g, DM_OP_MASK_ADD, "attn_mask", s, J, IN(s, mask), 2, IN(sm), 1));
        if (*ok) g->op[om].causal = cfg->causal != 0;
        CK(pw(g, DM_OP_SOFTMAX, "attn_softmax", s, J, IN(sm), 1, IN(a), 1));
        od = CK(pw(g, DM_OP_DROPOUT, "attn_probs_dropout", s, J, IN(a), 1, IN(ad), 1));
        if (*ok) g->op[od].stream = DM_DROP_ATTN_PROBS;
        CK(mm(g, "attn_context", "bhjk,bkhp->bjhp", ad, V, ctx, 1.0f));
    }
    CK(mm(g, "attn_out_proj", "bjhp,ihp->bji", ctx, wo, att_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "attn_out_bias", att, I, IN(att_mm, bo), 2, IN(att), 1));
    od = CK(pw(g, DM_OP_DROPOUT, "attn_out_dropout", att, I, IN(att), 1, IN(attd), 1));
    if (*ok) g->op[od].stream = DM_DROP_ATTN_OUT;
    if (pre) {
        CK(pw(g, DM_OP_ADD, "attn_residual", att, I, IN(attd, x), 2, IN(h1), 1));
        oln = CK(pw(g, DM_OP_LAYERNORM, "ffn_layernorm", att, I, IN(h1, g2, be2), 3, IN(r2, mu2, rs2), 3));
    } else {
        CK(pw(g, DM_OP_ADD, "attn_residual", att, I, IN(attd, x), 2, IN(r1), 1));
        oln = CK(pw(g, DM_OP_LAYERNORM, "attn_layernorm", att, I, IN(r1, g1, be1), 3, IN(h1, mu1, rs1), 3));
    }
    if (*ok) g->op[oln].eps = cfg->eps;
}

/* The feed-forward block's ops up to its residual add, and LN2 after that add (post-LN
 * only: pre-LN's LN2 came with the attention block). */
static void add_ffn_ops(dm_graph *g, const dm_layer_config *cfg, int pre, const enc_tensors *ts,
                        int *ok) {
    const int64_t I = cfg->hidden, U = cfg->ffn;
    const int w1 = ts->w1, b1 = ts->b1, w2 = ts->w2, b2 = ts->b2, g2 = ts->g2, be2 = ts->be2;
    const int h1 = ts->h1, f1_mm = ts->f1_mm, f1 = ts->f1, act = ts->act, f2_mm = ts->f2_mm,
              f2 = ts->f2, f2d = ts->f2d, r2 = ts->r2, y = ts->y, mu2 = ts->mu2, rs2 = ts->rs2;
    CK(mm(g, "ffn_in_proj", "bji,ui->bju", pre ? r2 : h1, w1, f1_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "ffn_in_bias", f1, U, IN(f1_mm, b1), 2, IN(f1), 1));
    int oa = CK(pw(g, DM_OP_ACT, "ffn_act", f1, U, IN(f1), 1, IN(act), 1));
    if (*ok) g->op[oa].act = cfg->act;
    CK(mm(g, "ffn_out_proj", "bju,iu->bji", act, w2, f2_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "ffn_out_bias", f2, I, IN(f2_mm, b2), 2, IN(f2), 1));
    int od = CK(pw(g, DM_OP_DROPOUT, "ffn_out_dropout", f2, I, IN(f2), 1, IN(f2d), 1));
    if (*ok) g->op[od].stream = DM_DROP_FFN_OUT;
    if (pre) {
        CK(pw(g, DM_OP_ADD, "ffn_residual", f2, I, IN(f2d, h1), 2, IN(y), 1));
    } else {
        CK(pw(g, DM_OP_ADD, "ffn_residual", f2, I, IN(f2d, h1), 2, IN(r2), 1));
        int oln = CK(pw(g, DM_OP_LAYERNORM, "ffn_layernorm", f2, I, IN(r2, g2, be2), 3, IN(y, mu2, rs2), 3));
        if (*ok) g->op[oln].eps = cfg->eps;
    }
}

/* Exports the 16 parameters under Hugging Face names: Q/K/V's weights and biases as views
 * (made here) of the stacked tensors, the others as they are. */
static dm_status export_params(dm_graph *g, const dm_layer_config *cfg, const enc_tensors *ts,
                               dm_encoder *enc, int *ok) {
    const int64_t I = cfg->hidden, U = cfg->ffn;
    const char *qkvn[3] = {"query", "key", "value"};
    int pw_ids[DM_NUM_PARAMS];
    for (int q = 0; q < 3; q++) {
        char map[8], name[64];
        snprintf(map, sizeof map, "%dhpi", q);
        snprintf(name, sizeof name, "attention.self.%s.weight", qkvn[q]);
        pw_ids[2 * q] = CK(dm_graph_view(g, ts->wqkv, name, map));
        snprintf(map, sizeof map, "%dhp", q);
        snprintf(name, sizeof name, "attention.self.%s.bias", qkvn[q]);
        pw_ids[2 * q + 1] = CK(dm_graph_view(g, ts->bqkv, name, map));
    }
    if (!*ok) return dm_last_status();
    int rest[10] = {ts->wo, ts->bo, ts->g1, ts->be1, ts->w1,
                    ts->b1, ts->w2, ts->b2, ts->g2, ts->be2};
    for (int k = 0; k < 10; k++) pw_ids[6 + k] = rest[k];
    for (int k = 0; k < DM_NUM_PARAMS; k++) {
        /* the shapes of Hugging Face's state dict: weights (out, in) as torch.nn.Linear
         * (the output projection's (i, i) over letters "ihp"; Q/K/V's over "hpi"),
         * biases and LayerNorm parameters vectors (Q/K/V's are (h, p) views here) */
        const dm_tensor *t = &g->t[pw_ids[k]];
        const char *nm = dm_param_names[k];
        if (t->ndim == 1 || !strstr(nm, ".weight") || strstr(nm, "LayerNorm"))
            export(enc, nm, pw_ids[k], 1, t->numel, 0, 0, 1);
        else if (!strncmp(nm, "intermediate.", 13))
            export(enc, nm, pw_ids[k], 2, U, I, 0, 1);
        else if (!strncmp(nm, "output.", 7))
            export(enc, nm, pw_ids[k], 2, I, U, 0, 1);
        else
            export(enc, nm, pw_ids[k], 2, I, I, 0, 1);
    }
    return DM_OK;
}

/* The backward: grad_output, autodiff from it (grad_hidden_states too with input_grad),
 * and their exports. */
static dm_status add_backward(dm_graph *g, const dm_layer_config *cfg, int input_grad,
                              dm_encoder *enc, int *ok) {
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden;
    const int x = enc->x, y = enc->y;
    int dy = CK(T(g, "grad_output", "bji", DM_ROLE_INPUT));
    if (!*ok) return dm_last_status();
    int dx = -1;
    DM_TRY(dm_autodiff(g, y, dy, input_grad ? x : -1, &dx));
    if (dx >= 0) g->t[dx].role = DM_ROLE_OUTPUT;
    enc->dy = dy;
    enc->dx = dx;
    export(enc, "grad_output", dy, 3, B, J, I, 0);
    if (dx >= 0) export(enc, "grad_hidden_states", dx, 3, B, J, I, 0);
    return DM_OK;
}

/* Exports the parameter gradients: the gradient roots of Wqkv and bqkv get HF-named views. */
dm_status dm_gb_export_param_grads(dm_graph *g, dm_encoder *enc) {
    int nexp = enc->n;
    for (int k = 0; k < nexp; k++) {
        if (!enc->e[k].is_param) continue;
        const dm_tensor *pt = &g->t[enc->e[k].tensor];
        int root = pt->base >= 0 ? pt->base : enc->e[k].tensor;
        int groot = -1;
        for (int t = 0; t < g->nt; t++)
            if (g->t[t].role == DM_ROLE_PARAM_GRAD && g->t[t].base < 0 &&
                strncmp(g->t[t].name + 2, g->t[root].name, DM_NAME_LEN - 2) == 0 &&
                g->t[t].name[0] == 'd' && g->t[t].name[1] == '_')
                groot = t;
        if (groot < 0) return dm_fail(DM_ERR_INTERNAL, "no gradient for %s", enc->e[k].name);
        int gt = groot;
        if (pt->base >= 0) {
            gt = dm_graph_clone(g, enc->e[k].tensor);
            if (gt < 0) return dm_last_status();
            g->t[gt].base = groot;
            g->t[gt].role = DM_ROLE_PARAM_GRAD;
        }
        char name[64];
        snprintf(name, sizeof name, "%s.grad", enc->e[k].name);
        if (enc->n >= DM_MAX_EXPORTS) return dm_fail(DM_ERR_INTERNAL, "too many exports");
        export(enc, name, gt, enc->e[k].ndim, enc->e[k].shape[0], enc->e[k].shape[1], 0, 0);
    }
    return DM_OK;
}

dm_status dm_build_encoder(dm_graph *g, const dm_layer_config *cfg, int forward_only, int input_grad, int unpad,
                           int attn_op, dm_encoder *enc) {
    DM_TRY(dm_layer_config_check(cfg));
    if (attn_op && (unpad || cfg->causal))
        return dm_fail(DM_ERR_UNSUPPORTED, "attention as one op with a mask is for a padded layer that is not causal%s",
                       unpad ? " (an unpadded layer's attention is one op already)" : ": a causal layer takes it unpadded "
                       "(seq_lengths), else leave attention_op at 0 or -1");
    memset(enc, 0, sizeof *enc);
    int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden, H = cfg->heads, U = cfg->ffn;
    if (unpad) snprintf(g->live, sizeof g->live, "bj"); /* a step runs on its tokens alone */
    D('b') = B;
    D('j') = J;
    D('k') = J;
    D('h') = H;
    D('p') = I / H;
    D('i') = I;
    D('u') = U;
    D('q') = 3;
    int ok = 1;
    enc_tensors ts;
    /* inputs and parameters */
    add_inputs_and_params(g, unpad, &ts, &ok);
    if (!ok) return dm_last_status();
    const int pre = cfg->norm == DM_NORM_PRE;
    add_activations(g, pre, unpad, attn_op, &ts, &ok);
    if (!ok) return dm_last_status();

    int n = g->nop;
    add_attention_ops(g, cfg, pre, unpad, attn_op, &ts, &ok);
    add_ffn_ops(g, cfg, pre, &ts, &ok);
    if (!ok) return dm_last_status();
    for (int o = n; o < g->nop; o++) g->op[o].p = cfg->dropout;
    enc->nfwd_ops = g->nop;

    enc->x = ts.x;
    enc->mask = ts.mask;
    enc->y = ts.y;
    enc->dy = enc->dx = -1;
    export(enc, "hidden_states", ts.x, 3, B, J, I, 0);
    if (unpad)
        export(enc, "seq_lengths", ts.mask, 1, B, 0, 0, 0);
    else
        export(enc, "attention_mask", ts.mask, 2, B, J, 0, 0);
    export(enc, "output", ts.y, 3, B, J, I, 0);
    DM_TRY(export_params(g, cfg, &ts, enc, &ok));
    if (forward_only) return DM_OK;

    DM_TRY(add_backward(g, cfg, input_grad, enc, &ok));
    return dm_gb_export_param_grads(g, enc);
}
