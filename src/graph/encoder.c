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

static int ck_(int v, int *ok) {
    if (v < 0) *ok = 0;
    return v < 0 ? 0 : v;
}

static int T(dm_graph *g, const char *name, const char *letters, dm_role role) {
    return dm_graph_tensor(g, name, letters, role);
}

/* Appends a pointwise-family op over (rows, cols) = (numel / cols, cols) of `space`. */
static int pw(dm_graph *g, dm_op_kind kind, const char *name, int space, int64_t cols,
              const int *in, int nin, const int *out, int nout) {
    dm_op op = {.kind = kind, .nin = nin, .nout = nout, .cols = cols};
    snprintf(op.name, sizeof op.name, "%s", name);
    op.rows = g->t[space].numel / cols;
    memcpy(op.in, in, sizeof(int) * (size_t)nin);
    memcpy(op.out, out, sizeof(int) * (size_t)nout);
    return dm_graph_op(g, &op);
}

static int mm(dm_graph *g, const char *name, const char *spec, int a, int b, int c,
              float alpha) {
    dm_op op = {.kind = DM_OP_CONTRACT, .nin = 2, .nout = 1, .alpha = alpha};
    snprintf(op.name, sizeof op.name, "%s", name);
    snprintf(op.spec, sizeof op.spec, "%s", spec);
    op.in[0] = a;
    op.in[1] = b;
    op.out[0] = c;
    return dm_graph_op(g, &op);
}

static void export(dm_encoder *e, const char *name, int tensor, int ndim, int64_t s0,
                   int64_t s1, int64_t s2, int is_param) {
    dm_export *x = &e->e[e->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->tensor = tensor;
    x->ndim = ndim;
    x->shape[0] = s0;
    x->shape[1] = s1;
    x->shape[2] = s2;
    x->is_param = is_param;
}

dm_status dm_build_encoder(dm_graph *g, const dm_layer_config *cfg, int forward_only, int input_grad,
                           dm_encoder *enc) {
    DM_TRY(dm_layer_config_check(cfg));
    memset(enc, 0, sizeof *enc);
    int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden, H = cfg->heads, U = cfg->ffn;
    D('b') = B;
    D('j') = J;
    D('k') = J;
    D('h') = H;
    D('p') = I / H;
    D('i') = I;
    D('u') = U;
    D('q') = 3;
    int ok = 1;
#define CK(x) ck_(x, &ok)
    /* inputs and parameters */
    int x = CK(T(g, "hidden_states", "bji", DM_ROLE_INPUT));
    int mask = CK(T(g, "attention_mask", "bk", DM_ROLE_INPUT));
    int wqkv = CK(T(g, "Wqkv", "qhpi", DM_ROLE_PARAM));
    int bqkv = CK(T(g, "bqkv", "qhp", DM_ROLE_PARAM));
    int wo = CK(T(g, "Wo", "ihp", DM_ROLE_PARAM));
    int bo = CK(T(g, "bo", "i", DM_ROLE_PARAM));
    int g1 = CK(T(g, "ln1_gamma", "i", DM_ROLE_PARAM));
    int be1 = CK(T(g, "ln1_beta", "i", DM_ROLE_PARAM));
    int w1 = CK(T(g, "W1", "ui", DM_ROLE_PARAM));
    int b1 = CK(T(g, "b1", "u", DM_ROLE_PARAM));
    int w2 = CK(T(g, "W2", "iu", DM_ROLE_PARAM));
    int b2 = CK(T(g, "b2", "i", DM_ROLE_PARAM));
    int g2 = CK(T(g, "ln2_gamma", "i", DM_ROLE_PARAM));
    int be2 = CK(T(g, "ln2_beta", "i", DM_ROLE_PARAM));
    if (!ok) return DM_ERR_OOM;

    /* attention */
    int qkv_mm = CK(T(g, "qkv_mm", "bjqhp", DM_ROLE_ACT));
    int qkv = CK(T(g, "qkv", "bjqhp", DM_ROLE_ACT));
    int Q = CK(dm_graph_view(g, qkv, "Q", "bj0hp"));
    int K = CK(dm_graph_view(g, qkv, "K", "bk1hp"));
    int V = CK(dm_graph_view(g, qkv, "V", "bk2hp"));
    int s = CK(T(g, "scores", "bhjk", DM_ROLE_ACT));
    int sm = CK(T(g, "scores_masked", "bhjk", DM_ROLE_ACT));
    int a = CK(T(g, "probs", "bhjk", DM_ROLE_ACT));
    int ad = CK(T(g, "probs_drop", "bhjk", DM_ROLE_ACT));
    int ctx = CK(T(g, "ctx", "bjhp", DM_ROLE_ACT));
    int att_mm = CK(T(g, "attn_mm", "bji", DM_ROLE_ACT));
    int att = CK(T(g, "attn", "bji", DM_ROLE_ACT));
    int attd = CK(T(g, "attn_drop", "bji", DM_ROLE_ACT));
    const int pre = cfg->norm == DM_NORM_PRE;
    /* post-LN: resid1 = attn_drop + X, h1 = LN1(resid1); pre-LN: ln1_out = LN1(X),
     * h1 = attn_drop + X */
    int r1 = CK(T(g, pre ? "ln1_out" : "resid1", "bji", DM_ROLE_ACT));
    int h1 = CK(T(g, "h1", "bji", DM_ROLE_ACT));
    int mu1 = CK(T(g, "ln1_mean", "bj", DM_ROLE_ACT));
    int rs1 = CK(T(g, "ln1_rstd", "bj", DM_ROLE_ACT));
    /* feed-forward */
    int f1_mm = CK(T(g, "ffn1_mm", "bju", DM_ROLE_ACT));
    int f1 = CK(T(g, "ffn1", "bju", DM_ROLE_ACT));
    int act = CK(T(g, "ffn_act", "bju", DM_ROLE_ACT));
    int f2_mm = CK(T(g, "ffn2_mm", "bji", DM_ROLE_ACT));
    int f2 = CK(T(g, "ffn2", "bji", DM_ROLE_ACT));
    int f2d = CK(T(g, "ffn2_drop", "bji", DM_ROLE_ACT));
    /* post-LN: resid2 = ffn2_drop + h1, output = LN2(resid2); pre-LN: ln2_out = LN2(h1),
     * output = ffn2_drop + h1 */
    int r2 = CK(T(g, pre ? "ln2_out" : "resid2", "bji", DM_ROLE_ACT));
    int y = CK(T(g, "output", "bji", DM_ROLE_OUTPUT));
    int mu2 = CK(T(g, "ln2_mean", "bj", DM_ROLE_ACT));
    int rs2 = CK(T(g, "ln2_rstd", "bj", DM_ROLE_ACT));
    if (!ok) return DM_ERR_OOM;

    float scale = (float)(1.0 / sqrt((double)D('p')));
    int n = g->nop;
#define IN(...) ((const int[]){__VA_ARGS__})
    int oln;
    if (pre) {
        oln = CK(pw(g, DM_OP_LAYERNORM, "attn_layernorm", x, I, IN(x, g1, be1), 3, IN(r1, mu1, rs1), 3));
        if (ok) g->op[oln].eps = cfg->eps;
    }
    CK(mm(g, "qkv_proj", "bji,qhpi->bjqhp", pre ? r1 : x, wqkv, qkv_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "qkv_bias", qkv, 3 * I, IN(qkv_mm, bqkv), 2, IN(qkv), 1));
    CK(mm(g, "attn_scores", "bjhp,bkhp->bhjk", Q, K, s, scale));
    int om = CK(pw(g, DM_OP_MASK_ADD, "attn_mask", s, J, IN(s, mask), 2, IN(sm), 1));
    if (ok) g->op[om].causal = cfg->causal != 0;
    CK(pw(g, DM_OP_SOFTMAX, "attn_softmax", s, J, IN(sm), 1, IN(a), 1));
    int od = CK(pw(g, DM_OP_DROPOUT, "attn_probs_dropout", s, J, IN(a), 1, IN(ad), 1));
    if (ok) g->op[od].stream = DM_DROP_ATTN_PROBS;
    CK(mm(g, "attn_context", "bhjk,bkhp->bjhp", ad, V, ctx, 1.0f));
    CK(mm(g, "attn_out_proj", "bjhp,ihp->bji", ctx, wo, att_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "attn_out_bias", att, I, IN(att_mm, bo), 2, IN(att), 1));
    od = CK(pw(g, DM_OP_DROPOUT, "attn_out_dropout", att, I, IN(att), 1, IN(attd), 1));
    if (ok) g->op[od].stream = DM_DROP_ATTN_OUT;
    if (pre) {
        CK(pw(g, DM_OP_ADD, "attn_residual", att, I, IN(attd, x), 2, IN(h1), 1));
        oln = CK(pw(g, DM_OP_LAYERNORM, "ffn_layernorm", att, I, IN(h1, g2, be2), 3, IN(r2, mu2, rs2), 3));
    } else {
        CK(pw(g, DM_OP_ADD, "attn_residual", att, I, IN(attd, x), 2, IN(r1), 1));
        oln = CK(pw(g, DM_OP_LAYERNORM, "attn_layernorm", att, I, IN(r1, g1, be1), 3, IN(h1, mu1, rs1), 3));
    }
    if (ok) g->op[oln].eps = cfg->eps;
    CK(mm(g, "ffn_in_proj", "bji,ui->bju", pre ? r2 : h1, w1, f1_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "ffn_in_bias", f1, U, IN(f1_mm, b1), 2, IN(f1), 1));
    int oa = CK(pw(g, DM_OP_ACT, "ffn_act", f1, U, IN(f1), 1, IN(act), 1));
    if (ok) g->op[oa].act = cfg->act;
    CK(mm(g, "ffn_out_proj", "bju,iu->bji", act, w2, f2_mm, 1.0f));
    CK(pw(g, DM_OP_BIAS_ADD, "ffn_out_bias", f2, I, IN(f2_mm, b2), 2, IN(f2), 1));
    od = CK(pw(g, DM_OP_DROPOUT, "ffn_out_dropout", f2, I, IN(f2), 1, IN(f2d), 1));
    if (ok) g->op[od].stream = DM_DROP_FFN_OUT;
    if (pre) {
        CK(pw(g, DM_OP_ADD, "ffn_residual", f2, I, IN(f2d, h1), 2, IN(y), 1));
    } else {
        CK(pw(g, DM_OP_ADD, "ffn_residual", f2, I, IN(f2d, h1), 2, IN(r2), 1));
        oln = CK(pw(g, DM_OP_LAYERNORM, "ffn_layernorm", f2, I, IN(r2, g2, be2), 3, IN(y, mu2, rs2), 3));
        if (ok) g->op[oln].eps = cfg->eps;
    }
    if (!ok) return DM_ERR_OOM;
    for (int o = n; o < g->nop; o++) g->op[o].p = cfg->dropout;
    enc->nfwd_ops = g->nop;

    enc->x = x;
    enc->mask = mask;
    enc->y = y;
    enc->dy = enc->dx = -1;
    export(enc, "hidden_states", x, 3, B, J, I, 0);
    export(enc, "attention_mask", mask, 2, B, J, 0, 0);
    export(enc, "output", y, 3, B, J, I, 0);

    /* parameters under Hugging Face names: slices of the stacked tensors */
    const char *qkvn[3] = {"query", "key", "value"};
    int pw_ids[DM_NUM_PARAMS];
    for (int q = 0; q < 3; q++) {
        char map[8], name[64];
        snprintf(map, sizeof map, "%dhpi", q);
        snprintf(name, sizeof name, "attention.self.%s.weight", qkvn[q]);
        pw_ids[2 * q] = CK(dm_graph_view(g, wqkv, name, map));
        snprintf(map, sizeof map, "%dhp", q);
        snprintf(name, sizeof name, "attention.self.%s.bias", qkvn[q]);
        pw_ids[2 * q + 1] = CK(dm_graph_view(g, bqkv, name, map));
    }
    if (!ok) return DM_ERR_OOM;
    int rest[10] = {wo, bo, g1, be1, w1, b1, w2, b2, g2, be2};
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
    if (forward_only) return DM_OK;

    int dy = CK(T(g, "grad_output", "bji", DM_ROLE_INPUT));
    if (!ok) return DM_ERR_OOM;
    int dx = -1;
    DM_TRY(dm_autodiff(g, y, dy, input_grad ? x : -1, &dx));
    if (dx >= 0) g->t[dx].role = DM_ROLE_OUTPUT;
    enc->dy = dy;
    enc->dx = dx;
    export(enc, "grad_output", dy, 3, B, J, I, 0);
    if (dx >= 0) export(enc, "grad_hidden_states", dx, 3, B, J, I, 0);
    /* parameter gradients: the gradient roots of Wqkv and bqkv get HF-named views */
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
            if (gt < 0) return DM_ERR_OOM;
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
