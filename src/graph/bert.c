/* bert.c: the graphs of a whole BERT beside its encoder layers (encoder.h): the
 * embeddings, and BertForMaskedLM's head with its cross-entropy, scored at the masked
 * positions only. Each is its own graph, built forward and differentiated by autodiff as
 * the layer is; the model chains them around the layers.
 *
 * Letters: b batch, j position, i hidden, e hidden (the head's dense output), v vocabulary,
 * n positions of the position table, t token types, m the masked positions scored.
 *   embeddings: x (b,j,i) = word[ids] + position[pos] + token_type[types];
 *               output = dropout(LN(x))
 *   MLM head:   h (m,i) = hidden[masked_positions];  t = LN(act(h . W^T + b)) (m,e);
 *               logits (m,v) = t . decoder^T + bias;  loss (m) = cross-entropy(logits, labels)
 *               (sizes xent DM_XENT_FUSED: the last line one op, LINEAR_XENT, that writes no
 *               logits but each row's argmax id, exported as "predictions")
 *   classifier: h (b,i) = hidden[cls_positions];  pooled (b,e) = tanh(h . W^T + b);
 *               logits (b,c) = dropout(pooled) . C^T + bias (c: the classes);
 *               loss (b) = cross-entropy(logits, labels) */
#include <stdio.h>
#include <string.h>

#include "core/philox.h"
#include "core/status.h"
#include "graph/build.h"
#include "graph/encoder.h"

#define D(c) g->dim[(c) - 'a']
#define IN(...) ((const int[]){__VA_ARGS__})

static int ck_(int v, int *ok) {
    if (v < 0) *ok = 0;
    return v < 0 ? 0 : v;
}
#define CK(x) ck_(x, ok)

static int T(dm_graph *g, const char *name, const char *letters, dm_role role) {
    return dm_graph_tensor(g, name, letters, role);
}

/* A gather: out (rows, cols) = table[idx] (the table nindex x cols). */
static int gather(dm_graph *g, const char *name, int table, int idx, int out, int64_t rows, int64_t cols,
                  int64_t nindex) {
    dm_op op = {.kind = DM_OP_EMBED, .nin = 2, .nout = 1, .rows = rows, .cols = cols, .nindex = nindex};
    snprintf(op.name, sizeof op.name, "%s", name);
    op.in[0] = table;
    op.in[1] = idx;
    op.out[0] = out;
    return dm_graph_op(g, &op);
}

static dm_status check_sizes(const dm_layer_config *cfg, const dm_bert_sizes *sz, int head) {
    DM_TRY(dm_layer_config_check(cfg));
    if (!sz) return dm_fail(DM_ERR_INVALID_ARG, "the model's sizes are missing");
    if (sz->vocab < 1 || sz->vocab > (1 << 24) || sz->positions < 1 || sz->types < 1)
        return dm_fail(DM_ERR_INVALID_ARG, "vocabulary %lld, positions %lld, token types %lld: each must be at "
                       "least 1 (the vocabulary at most 2^24)", (long long)sz->vocab, (long long)sz->positions,
                       (long long)sz->types);
    if (cfg->seq > sz->positions)
        return dm_fail(DM_ERR_INVALID_ARG, "sequences of %lld tokens, but the model has %lld positions "
                       "(max_position_embeddings): use --seq %lld or less", (long long)cfg->seq,
                       (long long)sz->positions, (long long)sz->positions);
    if (head && (sz->predictions < 1 || sz->predictions > cfg->batch * cfg->seq))
        return dm_fail(DM_ERR_INVALID_ARG, "%lld masked positions scored per batch: give 1 to b * j = %lld",
                       (long long)sz->predictions, (long long)(cfg->batch * cfg->seq));
    return DM_OK;
}

/* The backward from `dy` (named grad_name, exported with the shape of y) and the parameter
 * gradients' exports; x >= 0: its gradient too, exported as dx_name. */
static dm_status backward(dm_graph *g, dm_encoder *enc, int y, int dy, int x, const char *dx_name, int64_t d0,
                          int64_t d1, int64_t d2) {
    int dx = -1;
    DM_TRY(dm_autodiff(g, y, dy, x, &dx));
    if (dx >= 0) {
        g->t[dx].role = DM_ROLE_OUTPUT;
        dm_gb_export(enc, dx_name, dx, 3, d0, d1, d2, 0);
    }
    enc->dy = dy;
    enc->dx = dx;
    return dm_gb_export_param_grads(g, enc);
}

dm_status dm_build_embeddings(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                              dm_encoder *enc) {
    DM_TRY(check_sizes(cfg, sz, 0));
    memset(enc, 0, sizeof *enc);
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden;
    D('b') = B, D('j') = J, D('i') = I, D('v') = sz->vocab, D('n') = sz->positions, D('t') = sz->types;
    snprintf(g->live, sizeof g->live, "bj"); /* an unpadded model's step embeds its tokens alone */
    int ok_ = 1, *ok = &ok_;
    const int ids = CK(T(g, "input_ids", "bj", DM_ROLE_INPUT)), pos = CK(T(g, "position_ids", "bj", DM_ROLE_INPUT)),
              tt = CK(T(g, "token_type_ids", "bj", DM_ROLE_INPUT));
    const int word = CK(T(g, "word_embeddings", "vi", DM_ROLE_PARAM)),
              posw = CK(T(g, "position_embeddings", "ni", DM_ROLE_PARAM)),
              typew = CK(T(g, "token_type_embeddings", "ti", DM_ROLE_PARAM)),
              gam = CK(T(g, "emb_ln_gamma", "i", DM_ROLE_PARAM)), bet = CK(T(g, "emb_ln_beta", "i", DM_ROLE_PARAM));
    const int ew = CK(T(g, "emb_word", "bji", DM_ROLE_ACT)), ep = CK(T(g, "emb_position", "bji", DM_ROLE_ACT)),
              et = CK(T(g, "emb_type", "bji", DM_ROLE_ACT)), s1 = CK(T(g, "emb_sum1", "bji", DM_ROLE_ACT)),
              s2 = CK(T(g, "emb_sum", "bji", DM_ROLE_ACT)), ln = CK(T(g, "emb_ln", "bji", DM_ROLE_ACT)),
              mu = CK(T(g, "emb_ln_mean", "bj", DM_ROLE_ACT)), rs = CK(T(g, "emb_ln_rstd", "bj", DM_ROLE_ACT)),
              y = CK(T(g, "output", "bji", DM_ROLE_OUTPUT));
    if (!ok_) return dm_last_status();
    CK(gather(g, "word_embed", word, ids, ew, B * J, I, sz->vocab));
    CK(gather(g, "position_embed", posw, pos, ep, B * J, I, sz->positions));
    CK(gather(g, "token_type_embed", typew, tt, et, B * J, I, sz->types));
    CK(dm_gb_pw(g, DM_OP_ADD, "embed_sum1", ew, I, IN(ew, ep), 2, IN(s1), 1));
    CK(dm_gb_pw(g, DM_OP_ADD, "embed_sum", ew, I, IN(s1, et), 2, IN(s2), 1));
    const int oln = CK(dm_gb_pw(g, DM_OP_LAYERNORM, "embed_layernorm", ew, I, IN(s2, gam, bet), 3, IN(ln, mu, rs), 3));
    const int od = CK(dm_gb_pw(g, DM_OP_DROPOUT, "embed_dropout", ew, I, IN(ln), 1, IN(y), 1));
    if (!ok_) return dm_last_status();
    g->op[oln].eps = cfg->eps;
    g->op[od].stream = DM_DROP_EMBED;
    g->op[od].p = cfg->dropout;
    enc->nfwd_ops = g->nop;
    enc->x = ids;
    enc->mask = -1;
    enc->y = y;
    enc->dy = enc->dx = -1;
    dm_gb_export(enc, "input_ids", ids, 2, B, J, 0, 0);
    dm_gb_export(enc, "position_ids", pos, 2, B, J, 0, 0);
    dm_gb_export(enc, "token_type_ids", tt, 2, B, J, 0, 0);
    dm_gb_export(enc, "output", y, 3, B, J, I, 0);
    dm_gb_export(enc, "embeddings.word_embeddings.weight", word, 2, sz->vocab, I, 0, 1);
    dm_gb_export(enc, "embeddings.position_embeddings.weight", posw, 2, sz->positions, I, 0, 1);
    dm_gb_export(enc, "embeddings.token_type_embeddings.weight", typew, 2, sz->types, I, 0, 1);
    dm_gb_export(enc, "embeddings.LayerNorm.weight", gam, 1, I, 0, 0, 1);
    dm_gb_export(enc, "embeddings.LayerNorm.bias", bet, 1, I, 0, 0, 1);
    if (forward_only) return DM_OK;
    const int dy = T(g, "grad_output", "bji", DM_ROLE_INPUT);
    if (dy < 0) return dm_last_status();
    dm_gb_export(enc, "grad_output", dy, 3, B, J, I, 0);
    DM_TRY(backward(g, enc, y, dy, -1, NULL, 0, 0, 0));
    /* the word table's gradient skips the padding token's rows, as nn.Embedding's
     * padding_idx does in Hugging Face's BERT: its scatter reads its own ids, the input ids
     * with the padding id made -1 (an index the scatter skips), which the model writes */
    const int gid = T(g, "word_grad_ids", "bj", DM_ROLE_INPUT);
    if (gid < 0) return dm_last_status();
    int found = 0;
    for (int o = enc->nfwd_ops; o < g->nop; o++)
        if (g->op[o].kind == DM_OP_EMBED_BWD && g->op[o].in[1] == ids && !strcmp(g->op[o].name, "word_embed_bwd")) {
            g->op[o].in[1] = gid;
            found = 1;
        }
    if (!found) return dm_fail(DM_ERR_INTERNAL, "embeddings: no gradient of the word table");
    dm_gb_export(enc, "word_grad_ids", gid, 2, B, J, 0, 0);
    return DM_OK;
}

/* The head's tensors, in the order they are made. */
typedef struct {
    int x, mpos, labels, w, bw, gam, bet, dec, bias;
    int h, t_mm, t_b, t_act, t_ln, mu, rs, lg_mm, lg, loss, lse, pred;
} head_tensors;

static void head_tensors_make(dm_graph *g, head_tensors *h, int fused, int *ok) {
    h->x = CK(T(g, "hidden_states", "bji", DM_ROLE_INPUT));
    h->mpos = CK(T(g, "masked_positions", "m", DM_ROLE_INPUT));
    h->labels = CK(T(g, "labels", "m", DM_ROLE_INPUT));
    h->w = CK(T(g, "transform_W", "ei", DM_ROLE_PARAM));
    h->bw = CK(T(g, "transform_b", "e", DM_ROLE_PARAM));
    h->gam = CK(T(g, "transform_ln_gamma", "e", DM_ROLE_PARAM));
    h->bet = CK(T(g, "transform_ln_beta", "e", DM_ROLE_PARAM));
    h->dec = CK(T(g, "decoder_W", "ve", DM_ROLE_PARAM));
    h->bias = CK(T(g, "decoder_b", "v", DM_ROLE_PARAM));
    h->h = CK(T(g, "masked_hidden", "mi", DM_ROLE_ACT));
    h->t_mm = CK(T(g, "transform_mm", "me", DM_ROLE_ACT));
    h->t_b = CK(T(g, "transform", "me", DM_ROLE_ACT));
    h->t_act = CK(T(g, "transform_act", "me", DM_ROLE_ACT));
    h->t_ln = CK(T(g, "transform_ln", "me", DM_ROLE_ACT));
    h->mu = CK(T(g, "transform_ln_mean", "m", DM_ROLE_ACT));
    h->rs = CK(T(g, "transform_ln_rstd", "m", DM_ROLE_ACT));
    h->lg_mm = h->lg = h->pred = -1; /* fused: no logits; the argmax ids instead */
    if (fused) h->pred = CK(T(g, "predictions", "m", DM_ROLE_OUTPUT));
    else {
        h->lg_mm = CK(T(g, "logits_mm", "mv", DM_ROLE_ACT));
        h->lg = CK(T(g, "logits", "mv", DM_ROLE_ACT));
    }
    h->loss = CK(T(g, "loss", "m", DM_ROLE_OUTPUT));
    h->lse = CK(T(g, "logsumexp", "m", DM_ROLE_OUTPUT));
}

static void head_ops(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, const head_tensors *h,
                     int *ok) {
    const int64_t M = sz->predictions, I = cfg->hidden, V = sz->vocab;
    CK(gather(g, "masked_gather", h->x, h->mpos, h->h, M, I, cfg->batch * cfg->seq));
    CK(dm_gb_mm(g, "transform_proj", "mi,ei->me", h->h, h->w, h->t_mm, 1.0f));
    CK(dm_gb_pw(g, DM_OP_BIAS_ADD, "transform_bias", h->t_mm, I, IN(h->t_mm, h->bw), 2, IN(h->t_b), 1));
    const int oa = CK(dm_gb_pw(g, DM_OP_ACT, "transform_act", h->t_mm, I, IN(h->t_b), 1, IN(h->t_act), 1));
    const int oln = CK(dm_gb_pw(g, DM_OP_LAYERNORM, "transform_layernorm", h->t_mm, I, IN(h->t_act, h->gam, h->bet),
                                3, IN(h->t_ln, h->mu, h->rs), 3));
    if (h->pred >= 0) { /* the decoder, its bias and the cross-entropy in one op (ops.def) */
        dm_op op = {.kind = DM_OP_LINEAR_XENT, .nin = 4, .nout = 3, .rows = M, .cols = V, .nindex = I};
        snprintf(op.name, sizeof op.name, "decoder_cross_entropy");
        snprintf(op.spec, sizeof op.spec, "me,ve->mv");
        memcpy(op.in, IN(h->t_ln, h->dec, h->bias, h->labels), 4 * sizeof(int));
        memcpy(op.out, IN(h->loss, h->lse, h->pred), 3 * sizeof(int));
        CK(dm_graph_op(g, &op));
    } else {
        CK(dm_gb_mm(g, "decoder", "me,ve->mv", h->t_ln, h->dec, h->lg_mm, 1.0f));
        CK(dm_gb_pw(g, DM_OP_BIAS_ADD, "decoder_bias", h->lg_mm, V, IN(h->lg_mm, h->bias), 2, IN(h->lg), 1));
        CK(dm_gb_pw(g, DM_OP_XENT, "cross_entropy", h->lg_mm, V, IN(h->lg, h->labels), 2, IN(h->loss, h->lse), 2));
    }
    if (!*ok) return;
    g->op[oa].act = cfg->act;
    g->op[oln].eps = cfg->eps;
}

/* A head's forward end and its common exports: the hidden states it reads, the rows it
 * scores (their positions under pos_name) with their labels, and the per-row loss. */
static void head_exports(const dm_graph *g, dm_encoder *enc, const dm_layer_config *cfg, int x, int loss,
                         const char *pos_name, int pos, int labels, int64_t rows) {
    enc->nfwd_ops = g->nop;
    enc->x = x;
    enc->mask = -1;
    enc->y = loss;
    enc->dy = enc->dx = -1;
    dm_gb_export(enc, "hidden_states", x, 3, cfg->batch, cfg->seq, cfg->hidden, 0);
    dm_gb_export(enc, pos_name, pos, 1, rows, 0, 0, 0);
    dm_gb_export(enc, "labels", labels, 1, rows, 0, 0, 0);
    dm_gb_export(enc, "loss", loss, 1, rows, 0, 0, 0);
}

dm_status dm_build_mlm_head(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                            dm_encoder *enc) {
    DM_TRY(check_sizes(cfg, sz, 1));
    memset(enc, 0, sizeof *enc);
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden, M = sz->predictions, V = sz->vocab;
    D('b') = B, D('j') = J, D('i') = I, D('e') = I, D('v') = V, D('m') = M;
    snprintf(g->live, sizeof g->live, "m"); /* a step scores its masked positions alone */
    int ok_ = 1;
    head_tensors h;
    head_tensors_make(g, &h, sz->xent == DM_XENT_FUSED, &ok_);
    if (ok_) head_ops(g, cfg, sz, &h, &ok_);
    if (!ok_) return dm_last_status();
    head_exports(g, enc, cfg, h.x, h.loss, "masked_positions", h.mpos, h.labels, M);
    if (h.lg >= 0) dm_gb_export(enc, "logits", h.lg, 2, M, V, 0, 0);
    else dm_gb_export(enc, "predictions", h.pred, 1, M, 0, 0, 0);
    dm_gb_export(enc, "logsumexp", h.lse, 1, M, 0, 0, 0);
    dm_gb_export(enc, "cls.predictions.transform.dense.weight", h.w, 2, I, I, 0, 1);
    dm_gb_export(enc, "cls.predictions.transform.dense.bias", h.bw, 1, I, 0, 0, 1);
    dm_gb_export(enc, "cls.predictions.transform.LayerNorm.weight", h.gam, 1, I, 0, 0, 1);
    dm_gb_export(enc, "cls.predictions.transform.LayerNorm.bias", h.bet, 1, I, 0, 0, 1);
    dm_gb_export(enc, "cls.predictions.decoder.weight", h.dec, 2, V, I, 0, 1);
    dm_gb_export(enc, "cls.predictions.bias", h.bias, 1, V, 0, 0, 1);
    if (forward_only) return DM_OK;
    const int dy = T(g, "loss_weights", "m", DM_ROLE_INPUT);
    if (dy < 0) return dm_last_status();
    dm_gb_export(enc, "loss_weights", dy, 1, M, 0, 0, 0);
    return backward(g, enc, h.loss, dy, h.x, "grad_hidden_states", B, J, I);
}

/* BertForSequenceClassification's head: pooled (b,e) = tanh(hidden[cls] . W^T + b);
 * logits (b,c) = dropout(pooled) . C^T + bias; loss (b) = cross-entropy(logits, labels). */
typedef struct {
    int x, cpos, labels, w, bw, cw, cb;
    int h, p_mm, p_b, pooled, drop, lg_mm, lg, loss, lse;
} cls_tensors;

static void cls_tensors_make(dm_graph *g, cls_tensors *h, int *ok) {
    h->x = CK(T(g, "hidden_states", "bji", DM_ROLE_INPUT));
    h->cpos = CK(T(g, "cls_positions", "b", DM_ROLE_INPUT));
    h->labels = CK(T(g, "labels", "b", DM_ROLE_INPUT));
    h->w = CK(T(g, "pooler_W", "ei", DM_ROLE_PARAM));
    h->bw = CK(T(g, "pooler_b", "e", DM_ROLE_PARAM));
    h->cw = CK(T(g, "classifier_W", "ce", DM_ROLE_PARAM));
    h->cb = CK(T(g, "classifier_b", "c", DM_ROLE_PARAM));
    h->h = CK(T(g, "cls_hidden", "bi", DM_ROLE_ACT));
    h->p_mm = CK(T(g, "pooler_mm", "be", DM_ROLE_ACT));
    h->p_b = CK(T(g, "pooler_pre", "be", DM_ROLE_ACT));
    h->pooled = CK(T(g, "pooled", "be", DM_ROLE_ACT));
    h->drop = CK(T(g, "pooled_dropout", "be", DM_ROLE_ACT));
    h->lg_mm = CK(T(g, "logits_mm", "bc", DM_ROLE_ACT));
    h->lg = CK(T(g, "logits", "bc", DM_ROLE_ACT));
    h->loss = CK(T(g, "loss", "b", DM_ROLE_OUTPUT));
    h->lse = CK(T(g, "logsumexp", "b", DM_ROLE_OUTPUT));
}

static void cls_ops(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, const cls_tensors *h, int *ok) {
    const int64_t B = cfg->batch, I = cfg->hidden, C = sz->classes;
    CK(gather(g, "cls_gather", h->x, h->cpos, h->h, B, I, B * cfg->seq));
    CK(dm_gb_mm(g, "pooler_proj", "bi,ei->be", h->h, h->w, h->p_mm, 1.0f));
    CK(dm_gb_pw(g, DM_OP_BIAS_ADD, "pooler_bias", h->p_mm, I, IN(h->p_mm, h->bw), 2, IN(h->p_b), 1));
    const int oa = CK(dm_gb_pw(g, DM_OP_ACT, "pooler_tanh", h->p_mm, I, IN(h->p_b), 1, IN(h->pooled), 1));
    const int od = CK(dm_gb_pw(g, DM_OP_DROPOUT, "pooler_dropout", h->p_mm, I, IN(h->pooled), 1, IN(h->drop), 1));
    CK(dm_gb_mm(g, "classifier", "be,ce->bc", h->drop, h->cw, h->lg_mm, 1.0f));
    CK(dm_gb_pw(g, DM_OP_BIAS_ADD, "classifier_bias", h->lg_mm, C, IN(h->lg_mm, h->cb), 2, IN(h->lg), 1));
    CK(dm_gb_pw(g, DM_OP_XENT, "cross_entropy", h->lg_mm, C, IN(h->lg, h->labels), 2, IN(h->loss, h->lse), 2));
    if (!*ok) return;
    g->op[oa].act = DM_ACT_TANH;
    g->op[od].stream = DM_DROP_CLS;
    g->op[od].p = cfg->dropout;
}

dm_status dm_build_cls_head(dm_graph *g, const dm_layer_config *cfg, const dm_bert_sizes *sz, int forward_only,
                            dm_encoder *enc) {
    DM_TRY(check_sizes(cfg, sz, 0));
    if (sz->classes == 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "num_labels 1 is regression (mean squared error) in transformers: dmove "
                       "classifies only; give 2 or more classes");
    if (sz->classes < 2 || sz->classes > (1 << 20))
        return dm_fail(DM_ERR_INVALID_ARG, "%lld classes: a classifier has 2 to 2^20 labels", (long long)sz->classes);
    memset(enc, 0, sizeof *enc);
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden, C = sz->classes;
    D('b') = B, D('j') = J, D('i') = I, D('e') = I, D('c') = C;
    int ok_ = 1;
    cls_tensors h;
    cls_tensors_make(g, &h, &ok_);
    if (ok_) cls_ops(g, cfg, sz, &h, &ok_);
    if (!ok_) return dm_last_status();
    head_exports(g, enc, cfg, h.x, h.loss, "cls_positions", h.cpos, h.labels, B);
    dm_gb_export(enc, "logits", h.lg, 2, B, C, 0, 0);
    dm_gb_export(enc, "logsumexp", h.lse, 1, B, 0, 0, 0);
    dm_gb_export(enc, "pooled", h.pooled, 2, B, I, 0, 0);
    dm_gb_export(enc, "bert.pooler.dense.weight", h.w, 2, I, I, 0, 1);
    dm_gb_export(enc, "bert.pooler.dense.bias", h.bw, 1, I, 0, 0, 1);
    dm_gb_export(enc, "classifier.weight", h.cw, 2, C, I, 0, 1);
    dm_gb_export(enc, "classifier.bias", h.cb, 1, C, 0, 0, 1);
    if (forward_only) return DM_OK;
    const int dy = T(g, "loss_weights", "b", DM_ROLE_INPUT);
    if (dy < 0) return dm_last_status();
    dm_gb_export(enc, "loss_weights", dy, 1, B, 0, 0, 0);
    return backward(g, enc, h.loss, dy, h.x, "grad_hidden_states", B, J, I);
}
