/* model.c: a whole BertForMaskedLM as segments on one backend (model.h). */
#include "train/model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "dist/dist.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "train/train.h"

#define DM_MODEL_MAX_LAYERS 256

dm_status dm_model_new(dm_model **out, const dm_model_config *c, const dm_layer_options *opt) {
    if (!out || !c) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_new: NULL argument");
    *out = NULL;
    if (c->layers < 1 || c->layers > DM_MODEL_MAX_LAYERS)
        return dm_fail(DM_ERR_INVALID_ARG, "%d layers: a BERT has 1 to %d", c->layers, DM_MODEL_MAX_LAYERS);
    if (c->pad_id < 0 || c->pad_id >= c->sizes.vocab)
        return dm_fail(DM_ERR_INVALID_ARG, "padding id %lld is not in the vocabulary of %lld", (long long)c->pad_id,
                       (long long)c->sizes.vocab);
    dm_layer_options o = {0};
    if (opt) o = *opt;
    if (o.plan || o.recompute)
        return dm_fail(DM_ERR_UNSUPPORTED, "a whole model takes no --plan or --recompute yet");
    dm_model *m = calloc(1, sizeof *m);
    if (!m) return dm_fail(DM_ERR_OOM, "out of memory");
    m->c = *c;
    m->opt = o;
    dm_status s = dm_backend_find(o.device, &m->bk);
    if (s == DM_OK) s = m->bk->pool_new(&m->pool);
    if (s == DM_OK && !(m->enc = calloc((size_t)c->layers, sizeof *m->enc))) s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK && o.unpad && !(m->off = calloc((size_t)c->layer.batch + 1, sizeof *m->off)))
        s = dm_fail(DM_ERR_OOM, "out of memory");
    for (int64_t b = 0; m->off && b <= c->layer.batch; b++) m->off[b] = b * c->layer.seq; /* until a batch: whole */
    o.no_input_grad = 0; /* every layer's input gradient feeds the segment before */
    if (s == DM_OK) s = dm_layer_new_segment(&m->emb, &c->layer, &o, DM_SEG_EMBEDDINGS, &c->sizes, m->pool);
    for (int l = 0; s == DM_OK && l < c->layers; l++) {
        s = dm_layer_new_pooled(&m->enc[l], &c->layer, &o, m->pool, &m->share);
        if (s != DM_OK) dm_fail_context(s, "layer %d of %d: ", l, c->layers);
    }
    /* auto: the unfused head (the faster on the CPU as measured, dmove.h; on the GPU not
     * yet measured against the fused one, xent.cu) */
    if (m->c.sizes.xent == DM_XENT_AUTO) m->c.sizes.xent = DM_XENT_UNFUSED;
    if (s == DM_OK && c->head == DM_MODEL_HEAD_MLM)
        s = dm_layer_new_segment(&m->head, &c->layer, &o, DM_SEG_MLM_HEAD, &m->c.sizes, m->pool);
    else if (s == DM_OK && c->head == DM_MODEL_HEAD_CLS)
        s = dm_layer_new_segment(&m->head, &c->layer, &o, DM_SEG_CLS_HEAD, &m->c.sizes, m->pool);
    else if (s == DM_OK && c->head != DM_MODEL_HEAD_NONE)
        s = dm_fail(DM_ERR_INVALID_ARG, "model head kind %d: not a head dmove knows", (int)c->head);
    /* the segments' passes are chained in the backend: waits once per pass */
    if (s == DM_OK) {
        m->emb->defer_wait = 1;
        if (m->head) m->head->defer_wait = 1;
        for (int l = 0; l < c->layers; l++) m->enc[l]->defer_wait = 1;
    }
    if (s != DM_OK) {
        dm_model_free(m);
        return s;
    }
    *out = m;
    return DM_OK;
}

void dm_model_free(dm_model *m) {
    if (!m) return;
    dm_layer_free(m->emb);
    for (int l = 0; m->enc && l < m->c.layers; l++) dm_layer_free(m->enc[l]);
    dm_layer_free(m->head);
    if (m->bk) m->bk->pool_free(m->pool); /* after the layers that borrow from it */
    dm_layer_act_share_free(&m->share);
    for (int64_t k = 0; m->label_names && k < m->c.sizes.classes; k++) free(m->label_names[k]);
    free(m->label_names);
    free(m->enc);
    free(m->off);
    free(m->hidden);
    free(m);
}

/* The segment and its own name for a model name; NULL if there is none. */
static dm_layer *route(dm_model *m, const char *name, const char **rest) {
    static const char enc[] = "bert.encoder.layer.";
    if (!strncmp(name, "bert.embeddings.", 16)) {
        *rest = name + 5; /* "embeddings.*" */
        return m->emb;
    }
    const int cls = m->c.head == DM_MODEL_HEAD_CLS;
    if ((!cls && !strncmp(name, "cls.", 4)) ||
        (cls && (!strncmp(name, "bert.pooler.", 12) || !strncmp(name, "classifier.", 11)))) {
        *rest = name;
        return m->head; /* NULL without a head */
    }
    if (strncmp(name, enc, sizeof enc - 1) != 0) return NULL;
    const char *p = name + sizeof enc - 1;
    long l = 0;
    if (*p < '0' || *p > '9') return NULL;
    while (*p >= '0' && *p <= '9' && l <= DM_MODEL_MAX_LAYERS) l = l * 10 + (*p++ - '0');
    if (*p != '.' || l >= m->c.layers) return NULL;
    *rest = p + 1;
    return m->enc[l];
}

dm_status dm_model_tensor(dm_model *m, const char *name, float **data, int *ndim, int64_t shape[4]) {
    if (!m || !name || !data) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_tensor: NULL argument");
    /* the tied decoder is the word table (the head's copy is refreshed from it each forward) */
    if (m->c.head != DM_MODEL_HEAD_CLS && !strcmp(name, "cls.predictions.decoder.weight"))
        name = "bert.embeddings.word_embeddings.weight";
    const char *rest;
    dm_layer *L = route(m, name, &rest);
    if (!L)
        return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the model (it has bert.embeddings.*%s "
                       "bert.encoder.layer.<0..%d>.*%s)", name, m->head ? "," : " and", m->c.layers - 1,
                       !m->head ? "" : m->c.head == DM_MODEL_HEAD_CLS ? " and bert.pooler.dense.*, classifier.*"
                                                                     : " and cls.predictions.*");
    return dm_layer_tensor(L, rest, data, ndim, shape);
}

/* The seed of segment k (0 the embeddings, 1 .. L the layers, L + 1 the head) at step s:
 * the encoder layers' are the trainer's (dm_train_layer_seed of layer k - 1). */
static uint64_t segment_seed(const dm_model *m, int k, int64_t step) {
    return dm_train_layer_seed(m->c.layer.seed ^ m->seed_mix, k - 1, step);
}

dm_status dm_model_init_params(dm_model *m, uint64_t seed) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_init_params: NULL model");
    DM_TRY(dm_layer_init_params(m->emb, dm_train_layer_seed(seed, -1, 0)));
    for (int l = 0; l < m->c.layers; l++) DM_TRY(dm_layer_init_params(m->enc[l], dm_train_layer_seed(seed, l, 0)));
    if (m->head) DM_TRY(dm_layer_init_params(m->head, dm_train_layer_seed(seed, m->c.layers, 0)));
    /* the padding token's word row starts at 0, as transformers' _init_weights makes an
     * nn.Embedding's padding_idx row */
    float *w;
    DM_TRY(dm_layer_tensor(m->emb, "embeddings.word_embeddings.weight", &w, NULL, NULL));
    memset(w + m->c.pad_id * m->c.layer.hidden, 0, (size_t)m->c.layer.hidden * sizeof(float));
    return DM_OK;
}

/* The scored rows: each sequence's first ceil(predictions / b) masked positions (labels
 * >= 0) in order, `predictions` at most in all (the labels checked by the caller). A cap
 * per sequence, as BERT's max_predictions_per_seq: N ranks of b sequences each then score
 * the positions one process of N b scores, where predictions is a multiple of b (the
 * default, b ceil(j / 5), is). */
static dm_status batch_head(dm_model *m, const int32_t *labels) {
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq, n = B * J, M = m->c.sizes.predictions;
    const int64_t per_seq = (M + B - 1) / B;
    float *mp, *lab, *w = NULL;
    DM_TRY(dm_layer_tensor(m->head, "masked_positions", &mp, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->head, "labels", &lab, NULL, NULL));
    if (!m->opt.forward_only) DM_TRY(dm_layer_tensor(m->head, "loss_weights", &w, NULL, NULL));
    int64_t k = 0, dropped = 0, in_seq = 0;
    for (int64_t r = 0; r < n; r++) {
        if (r % J == 0) in_seq = 0;
        if (labels[r] < 0) continue;
        if (k == M || in_seq == per_seq) {
            dropped++;
            continue;
        }
        in_seq++;
        mp[k] = (float)(m->off ? m->off[r / m->c.layer.seq] + r % m->c.layer.seq : r); /* packed: its token's row */
        lab[k++] = (float)labels[r];
    }
    /* the loss is the mean over the global batch's scored positions (every rank's) */
    int64_t all[2] = {k, dropped};
    DM_TRY(dm_dist_sum_i64(m->dist, all, 2, "counting the masked positions"));
    m->counted = (int)k;
    m->counted_all = all[0];
    m->dropped = all[1];
    const float wk = m->loss_norm > 0 ? (float)(1.0 / m->loss_norm) : 1.0f / (float)all[0];
    for (int64_t r = 0; r < M; r++) {
        if (r >= k) mp[r] = 0.0f, lab[r] = -1.0f; /* a padding row: scored, but counts not */
        if (w) w[r] = r < k ? wk : 0.0f;
    }
    return DM_OK;
}

/* The classifier's rows: each sequence's [CLS] (its first position) and label; the mean
 * over the labelled ones (the labels checked by the caller). */
static dm_status batch_cls(dm_model *m, const int32_t *labels) {
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq;
    float *cp, *lab, *w = NULL;
    DM_TRY(dm_layer_tensor(m->head, "cls_positions", &cp, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->head, "labels", &lab, NULL, NULL));
    if (!m->opt.forward_only) DM_TRY(dm_layer_tensor(m->head, "loss_weights", &w, NULL, NULL));
    int64_t k = 0;
    for (int64_t b = 0; b < B; b++) k += labels[b] >= 0;
    int64_t all = k; /* the mean over the global batch's labelled sequences */
    DM_TRY(dm_dist_sum_i64(m->dist, &all, 1, "counting the labelled sequences"));
    const float wk = m->loss_norm > 0 ? (float)(1.0 / m->loss_norm) : 1.0f / (float)all;
    for (int64_t b = 0; b < B; b++) {
        cp[b] = (float)(m->off ? m->off[b] : b * J); /* packed: the sequence's first token */
        lab[b] = labels[b] >= 0 ? (float)labels[b] : -1.0f;
        if (w) w[b] = labels[b] >= 0 ? wk : 0.0f;
    }
    m->counted = (int)k;
    m->counted_all = all;
    m->dropped = 0;
    return DM_OK;
}

/* The batch checked whole before anything is written: a refused one leaves the last. */
static dm_status batch_check(const dm_model *m, const int32_t *ids, const int32_t *types, const int32_t *labels) {
    const int64_t n = m->c.layer.batch * m->c.layer.seq;
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= m->c.sizes.vocab)
            return dm_fail(DM_ERR_INVALID_ARG, "token id %d at position %lld is outside the vocabulary of %lld: "
                           "the data was made with another tokenizer", ids[r], (long long)r,
                           (long long)m->c.sizes.vocab);
        const int32_t t = types ? types[r] : 0;
        if (t < 0 || t >= m->c.sizes.types)
            return dm_fail(DM_ERR_INVALID_ARG, "token type %d at position %lld: the model has %lld types", t,
                           (long long)r, (long long)m->c.sizes.types);
        if (labels && m->c.head == DM_MODEL_HEAD_MLM && labels[r] >= m->c.sizes.vocab)
            return dm_fail(DM_ERR_INVALID_ARG, "label %d at position %lld is past the vocabulary of %lld", labels[r],
                           (long long)r, (long long)m->c.sizes.vocab);
    }
    for (int64_t b = 0; labels && m->c.head == DM_MODEL_HEAD_CLS && b < m->c.layer.batch; b++)
        if (labels[b] >= m->c.sizes.classes)
            return dm_fail(DM_ERR_INVALID_ARG, "label %d of sequence %lld is outside the %lld classes (0 to %lld; "
                           "negative: no label)", labels[b], (long long)b, (long long)m->c.sizes.classes,
                           (long long)m->c.sizes.classes - 1);
    return DM_OK;
}

/* Unpadded: each sequence's length from its mask (1s, then 0s) into m->off, the scored
 * positions on real tokens, every sequence of a classifier's batch at least its [CLS];
 * m->off changes only when the whole batch passes. */
static dm_status batch_lengths(dm_model *m, const float *mask, const int32_t *labels) {
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(B + 1));
    if (!off) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = DM_OK;
    off[0] = 0;
    for (int64_t b = 0; b < B && s == DM_OK; b++) {
        int64_t L = 0;
        while (L < J && (!mask || mask[b * J + L] != 0.0f)) L++;
        for (int64_t j = L; mask && j < J && s == DM_OK; j++)
            if (mask[b * J + j] != 0.0f)
                s = dm_fail(DM_ERR_INVALID_ARG, "sequence %lld: its attention_mask is not 1s then 0s (position %lld "
                            "after padding at %lld): an unpadded model takes the real tokens as a prefix; run "
                            "with --no-unpad", (long long)b, (long long)j, (long long)L);
        for (int64_t j = L; labels && m->c.head == DM_MODEL_HEAD_MLM && j < J && s == DM_OK; j++)
            if (labels[b * J + j] >= 0)
                s = dm_fail(DM_ERR_INVALID_ARG, "sequence %lld: a label at padded position %lld", (long long)b,
                            (long long)j);
        if (s == DM_OK && L == 0 && labels && m->c.head == DM_MODEL_HEAD_CLS && labels[b] >= 0)
            s = dm_fail(DM_ERR_INVALID_ARG, "sequence %lld is labelled but has no token (attention_mask all 0)",
                        (long long)b);
        off[b + 1] = off[b] + L;
    }
    if (s == DM_OK && off[B] == 0)
        s = dm_fail(DM_ERR_INVALID_ARG, "the batch has no token: every attention_mask is all 0");
    if (s == DM_OK) memcpy(m->off, off, sizeof(int64_t) * (size_t)(B + 1));
    free(off);
    return s;
}

dm_status dm_model_set_batch(dm_model *m, const int32_t *ids, const int32_t *types, const float *attention_mask,
                             const int32_t *labels) {
    if (!m || !ids || (!labels && m->head)) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_set_batch: NULL argument");
    DM_TRY(batch_check(m, ids, types, m->head ? labels : NULL));
    if (m->off) DM_TRY(batch_lengths(m, attention_mask, m->head ? labels : NULL));
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq, n = B * J;
    float *in, *pos, *tt, *gid = NULL;
    DM_TRY(dm_layer_tensor(m->emb, "input_ids", &in, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->emb, "position_ids", &pos, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->emb, "token_type_ids", &tt, NULL, NULL));
    if (!m->opt.forward_only) DM_TRY(dm_layer_tensor(m->emb, "word_grad_ids", &gid, NULL, NULL));
    for (int64_t r = 0; r < n; r++) { /* row q of the embeddings: padded row r, or packed */
        const int64_t b = r / J, j = r % J, q = m->off ? (j < m->off[b + 1] - m->off[b] ? m->off[b] + j : -1) : r;
        if (q < 0) continue;
        in[q] = (float)ids[r];
        if (gid) gid[q] = ids[r] == m->c.pad_id ? -1.0f : (float)ids[r];
        pos[q] = (float)j;
        tt[q] = (float)(types ? types[r] : 0);
    }
    for (int64_t q = m->off ? m->off[B] : n; q < n; q++) { /* past the packed tokens: padding, no gradient */
        in[q] = (float)m->c.pad_id, pos[q] = 0.0f, tt[q] = 0.0f;
        if (gid) gid[q] = -1.0f;
    }
    for (int l = 0; l < m->c.layers; l++) {
        float *mask;
        if (m->off) {
            DM_TRY(dm_layer_tensor(m->enc[l], "seq_lengths", &mask, NULL, NULL));
            for (int64_t b = 0; b < B; b++) mask[b] = (float)(m->off[b + 1] - m->off[b]);
            continue;
        }
        DM_TRY(dm_layer_tensor(m->enc[l], "attention_mask", &mask, NULL, NULL));
        for (int64_t r = 0; r < n; r++) mask[r] = attention_mask ? attention_mask[r] : 1.0f;
    }
    if (!m->head) return DM_OK;
    return m->c.head == DM_MODEL_HEAD_CLS ? batch_cls(m, labels) : batch_head(m, labels);
}

/* Tensor src of segment a into tensor dst of segment b, in the backend. */
static dm_status link(const dm_model *m, dm_layer *a, const char *src, dm_layer *b, const char *dst) {
    const int ts = dm_layer_tensor_id(a, src), td = dm_layer_tensor_id(b, dst);
    if (ts < 0 || td < 0) return dm_fail(DM_ERR_INTERNAL, "model: no %s or %s to link", src, dst);
    return m->bk->copy_tensor(b->st, td, a->st, ts);
}

/* A segment's input, from its host copy to the backend. */
static dm_status up(const dm_model *m, dm_layer *L, const char *name) {
    float *p;
    DM_TRY(dm_layer_tensor(L, name, &p, NULL, NULL));
    return m->bk->upload(L->st, dm_layer_tensor_id(L, name), p);
}

/* The host's copy of a segment's tensor, read after the backend's pass. */
static dm_status down(const dm_model *m, dm_layer *L, const char *name, float **p, int64_t *n) {
    int nd;
    int64_t sh[4];
    DM_TRY(dm_layer_tensor(L, name, p, &nd, sh));
    *n = 1;
    for (int d = 0; d < nd; d++) *n *= sh[d];
    return m->bk->download(L->st, dm_layer_tensor_id(L, name), *p);
}

/* Argmax hits over the scored rows (labels >= 0), from the logits (ties: the lowest id,
 * as torch.argmax); the fused MLM head gives the argmax ids themselves. */
static dm_status count_correct(dm_model *m, int64_t *correct) {
    float *lg, *lab;
    int64_t n;
    DM_TRY(dm_layer_tensor(m->head, "labels", &lab, NULL, NULL));
    int64_t hits = 0;
    if (m->c.head == DM_MODEL_HEAD_MLM && m->c.sizes.xent == DM_XENT_FUSED) {
        DM_TRY(down(m, m->head, "predictions", &lg, &n));
        for (int64_t r = 0; r < m->counted; r++) hits += lg[r] == lab[r];
        *correct = hits;
        return DM_OK;
    }
    DM_TRY(down(m, m->head, "logits", &lg, &n));
    const int64_t V = m->c.head == DM_MODEL_HEAD_CLS ? m->c.sizes.classes : m->c.sizes.vocab, rows = n / V;
#pragma omp parallel for reduction(+ : hits) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] < 0) continue;
        const float *row = lg + r * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        hits += best == (int64_t)lab[r];
    }
    *correct = hits;
    return DM_OK;
}

/* The batch's inputs to the backend (the parameters are the backend's: a trainer pushes
 * the ones changed on the host); the tied decoder takes the word table's values. */
static dm_status model_upload(dm_model *m) {
    static const char *const emb_in[4] = {"input_ids", "position_ids", "token_type_ids", "word_grad_ids"};
    static const char *const head_in[3] = {"masked_positions", "labels", "loss_weights"};
    static const char *const cls_in[3] = {"cls_positions", "labels", "loss_weights"};
    const int train = !m->opt.forward_only, cls = m->c.head == DM_MODEL_HEAD_CLS;
    for (int k = 0; k < 3 + train; k++) DM_TRY(up(m, m->emb, emb_in[k]));
    for (int l = 0; l < m->c.layers; l++) DM_TRY(up(m, m->enc[l], m->off ? "seq_lengths" : "attention_mask"));
    if (!m->head) return DM_OK;
    for (int k = 0; k < 2 + train; k++) DM_TRY(up(m, m->head, cls ? cls_in[k] : head_in[k]));
    if (cls) return DM_OK;
    return link(m, m->emb, "embeddings.word_embeddings.weight", m->head, "cls.predictions.decoder.weight");
}

/* Segment L's next steps on its first `rows` live rows (backend.h's set_rows), or on the
 * tokens of sequences of these lengths, where its backend and plan can (else it runs
 * whole: the same results, more work). */
static dm_status live_rows(const dm_model *m, dm_layer *L, int64_t rows, const float *lengths) {
    if (!m->bk->set_rows) return DM_OK;
    const dm_status s = m->bk->set_rows(L->st, rows, lengths);
    return s == DM_ERR_UNSUPPORTED ? DM_OK : s;
}

dm_status dm_model_forward(dm_model *m, int64_t step, double *loss, int64_t *correct) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_forward: NULL model");
    DM_TRY(model_upload(m));
    DM_TRY(dm_layer_set_seed(m->emb, segment_seed(m, 0, step)));
    if (m->off) { /* the packed tokens alone, their dropout keyed by the padded positions */
        float *len;
        DM_TRY(dm_layer_tensor(m->enc[0], "seq_lengths", &len, NULL, NULL));
        DM_TRY(live_rows(m, m->emb, 0, len));
    }
    DM_TRY(dm_layer_forward(m->emb));
    DM_TRY(link(m, m->emb, "output", m->enc[0], "hidden_states"));
    for (int l = 0; l < m->c.layers; l++) {
        DM_TRY(dm_layer_set_seed(m->enc[l], segment_seed(m, l + 1, step)));
        DM_TRY(dm_layer_forward(m->enc[l]));
        if (l + 1 < m->c.layers) DM_TRY(link(m, m->enc[l], "output", m->enc[l + 1], "hidden_states"));
    }
    dm_layer *last = m->enc[m->c.layers - 1];
    if (!m->head) {
        DM_TRY(m->bk->sync(last->st));
        if (loss) *loss = 0.0;
        if (correct) *correct = 0;
        return DM_OK;
    }
    DM_TRY(link(m, last, "output", m->head, "hidden_states"));
    DM_TRY(dm_layer_set_seed(m->head, segment_seed(m, m->c.layers + 1, step))); /* the classifier's dropout */
    if (m->c.head == DM_MODEL_HEAD_MLM) /* the scored rows alone (one at least: a row that counts not) */
        DM_TRY(live_rows(m, m->head, m->counted > 0 ? m->counted : 1, NULL));
    DM_TRY(dm_layer_forward(m->head));
    DM_TRY(m->bk->sync(m->head->st));
    float *rows;
    int64_t n;
    DM_TRY(down(m, m->head, "loss", &rows, &n));
    double v[2] = {0.0, 0.0}; /* the loss's sum (the rows that count not are 0), the hits */
    for (int64_t r = 0; r < n; r++) v[0] += rows[r];
    int64_t hits = -1;
    if (correct && !m->no_correct) DM_TRY(count_correct(m, &hits));
    v[1] = (double)hits;
    if (m->dist) DM_TRY(dm_dist_sum_f64(m->dist, v, 2, "summing the loss"));
    if (loss) *loss = m->counted_all ? v[0] / (double)m->counted_all : 0.0;
    if (correct) *correct = m->no_correct ? -1 : (int64_t)v[1];
    return DM_OK;
}

dm_status dm_model_hidden(dm_model *m, const float **hidden) {
    if (!m || !hidden) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_hidden: NULL argument");
    float *p;
    int64_t n;
    DM_TRY(down(m, m->enc[m->c.layers - 1], "output", &p, &n));
    *hidden = p;
    if (!m->off) return DM_OK;
    /* unpadded: the packed rows back at their padded places, the padding's rows 0 */
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq, I = m->c.layer.hidden;
    if (!m->hidden && !(m->hidden = malloc(sizeof(float) * (size_t)n))) return dm_fail(DM_ERR_OOM, "out of memory");
    for (int64_t b = 0; b < B; b++) {
        const int64_t L = m->off[b + 1] - m->off[b];
        memcpy(m->hidden + b * J * I, p + m->off[b] * I, sizeof(float) * (size_t)(L * I));
        memset(m->hidden + (b * J + L) * I, 0, sizeof(float) * (size_t)((J - L) * I));
    }
    *hidden = m->hidden;
    return DM_OK;
}

/* The decoder's gradient added into the word table's (the tie), in the backend's memory
 * (a GPU's: no host round trip of the two tables); the host copies are not refreshed. */
static dm_status tie_grads(dm_model *m) {
    const int ta = dm_layer_tensor_id(m->emb, "embeddings.word_embeddings.weight.grad");
    const int tb = dm_layer_tensor_id(m->head, "cls.predictions.decoder.weight.grad");
    if (ta < 0 || tb < 0) return dm_fail(DM_ERR_INTERNAL, "model: no word table or decoder gradient to tie");
    return m->bk->add_tensor(m->emb->st, ta, m->head->st, tb);
}

dm_status dm_model_backward(dm_model *m) { return dm_model_backward_each(m, NULL, NULL); }

dm_status dm_model_backward_each(dm_model *m, dm_status (*after)(void *ctx, int k), void *ctx) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_backward: NULL model");
    if (!m->head || m->opt.forward_only)
        return dm_fail(DM_ERR_INVALID_ARG, "this model has no loss to differentiate (no head, or forward-only)");
    const int L = m->c.layers;
    DM_TRY(dm_layer_backward(m->head));
    if (after) DM_TRY(after(ctx, L + 1));
    DM_TRY(link(m, m->head, "grad_hidden_states", m->enc[L - 1], "grad_output"));
    for (int l = L - 1; l >= 0; l--) {
        DM_TRY(dm_layer_backward(m->enc[l]));
        if (after) DM_TRY(after(ctx, l + 1));
        DM_TRY(link(m, m->enc[l], "grad_hidden_states", l > 0 ? m->enc[l - 1] : m->emb, "grad_output"));
    }
    DM_TRY(dm_layer_backward(m->emb));
    if (m->c.head == DM_MODEL_HEAD_MLM) DM_TRY(tie_grads(m));
    if (after) DM_TRY(after(ctx, 0));
    return m->bk->sync(m->emb->st);
}

/* --- the whole model's trainer (dmove.h: dm_trainer_new_bert) ------------------------ */

#include "core/hugealloc.h"
#include "train/trainer_internal.h"

/* One slot per parameter of segment L (index seg), the head's tied decoder left out. */
static dm_status add_slots(dm_trainer *T, int seg, int64_t *total) {
    dm_layer *L = T->L[seg];
    const int np = dm_layer_num_params(L);
    for (int k = 0; k < np; k++) {
        const char *name = dm_layer_param_name(L, k);
        if (!strcmp(name, "cls.predictions.decoder.weight")) continue; /* the word table's copy */
        dm_train_slot *sl = &T->slot[T->nslots];
        int nd = 0;
        int64_t sh[4] = {0, 0, 0, 0};
        DM_TRY(dm_layer_tensor(L, name, &sl->p, &nd, sh));
        char g[128];
        snprintf(g, sizeof g, "%s.grad", name);
        DM_TRY(dm_layer_tensor(L, g, &sl->g, NULL, NULL));
        sl->seg = seg;
        sl->pname = name;
        sl->ndim = nd;
        sl->n = nd == 1 ? sh[0] : sh[0] * sh[1];
        sl->shape[0] = sh[0];
        sl->shape[1] = nd == 2 ? sh[1] : 0;
        sl->decay = nd == 2; /* weights and tables decay; biases and LayerNorm parameters do not */
        sl->off = sl->moff = *total;
        sl->owner = -1;
        *total += sl->n;
        T->nslots++;
    }
    return DM_OK;
}

static dm_status bert_trainer_build(dm_trainer *T, const dm_model_config *mc, const dm_layer_options *opt) {
    DM_TRY(dm_model_new(&T->model, mc, opt));
    dm_model *m = T->model;
    T->bk = m->bk;
    T->nseg = mc->layers + 2;
    int maxslots = 0;
    if (!(T->L = calloc((size_t)T->nseg, sizeof *T->L))) return dm_fail(DM_ERR_OOM, "out of memory");
    T->L[0] = m->emb;
    for (int l = 0; l < mc->layers; l++) T->L[l + 1] = m->enc[l];
    T->L[T->nseg - 1] = m->head;
    for (int k = 0; k < T->nseg; k++) maxslots += dm_layer_num_params(T->L[k]);
    if (!(T->slot = calloc((size_t)maxslots, sizeof *T->slot))) return dm_fail(DM_ERR_OOM, "out of memory");
    int64_t total = 0;
    for (int k = 0; k < T->nseg; k++) DM_TRY(add_slots(T, k, &total));
    T->nparams = T->mcount = total;
    size_t bytes;
    if (!dm_mul_ok((size_t)total, 2 * sizeof(float), &bytes) || !(T->moments = dm_alloc_huge(bytes)))
        return dm_fail(DM_ERR_OOM, "cannot allocate %.2f GiB for the optimizer's moments",
                       (double)total * 8.0 / (1 << 30));
    memset(T->moments, 0, bytes);
    return dm_trainer_state_init(T);
}

dm_status dm_trainer_new_bert(dm_trainer **out, const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                              const dm_layer_options *opt, const dm_optim_config *optim) {
    if (!out || !cfg || !bert) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_new_bert: NULL argument");
    *out = NULL;
    DM_TRY(dm_layer_config_check(cfg));
    dm_layer_options o = {0};
    if (opt) o = *opt;
    if (o.forward_only) return dm_fail(DM_ERR_UNSUPPORTED, "a forward-only BERT trainer: not yet");
    dm_optim_config a;
    if (optim) a = *optim;
    else dm_optim_config_default(&a);
    DM_TRY(dm_optim_config_check(&a));
    if (bert->num_labels < 0 || bert->num_labels == 1)
        return dm_fail(DM_ERR_INVALID_ARG, "num_labels %lld: give 0 (BertForMaskedLM) or 2 or more classes "
                       "(BertForSequenceClassification; num_labels 1, regression, dmove has not)",
                       (long long)bert->num_labels);
    const int cls = bert->num_labels > 0;
    dm_model_config mc = {.layer = *cfg, .layers = layers, .head = cls ? DM_MODEL_HEAD_CLS : DM_MODEL_HEAD_MLM,
                          .pad_id = bert->pad_id};
    mc.sizes = (dm_bert_sizes){.vocab = bert->vocab, .positions = bert->positions, .types = bert->types,
                               .predictions = cls ? 0 : bert->predictions, .classes = bert->num_labels,
                               .xent = bert->xent};
    if (!cls && !mc.sizes.predictions) mc.sizes.predictions = cfg->batch * ((cfg->seq + 4) / 5); /* ceil(j/5) a sequence */
    dm_trainer *T = calloc(1, sizeof *T);
    if (!T) return dm_fail(DM_ERR_OOM, "out of memory");
    T->cfg = *cfg;
    T->opt = o;
    T->optim = a;
    T->grad_norm = -1.0;
    T->nlayers = layers;
    T->ranks = 1;
    dm_status s = bert_trainer_build(T, &mc, &o);
    if (s != DM_OK) {
        dm_trainer_free(T);
        return s;
    }
    *out = T;
    return DM_OK;
}

int dm_trainer_is_bert(const dm_trainer *T) { return T && T->model; }

dm_status dm_trainer_set_count_correct(dm_trainer *T, int on) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_count_correct: NULL trainer");
    if (!T->model) return dm_fail(DM_ERR_INVALID_ARG, "this trainer is a stack of layers, not a BERT");
    T->model->no_correct = !on;
    return DM_OK;
}

/* With accumulation, each row's loss weight a constant (the rows a batch can score, over
 * every rank), the gradient sums rescaled by the update to the mean over every
 * micro-batch's rows (trainer_state.c, grad_scale): K micro-batches weigh as one batch of
 * K times the size, whatever their counts; without, each batch's own mean. */
static void set_loss_norm(dm_trainer *T) {
    dm_model *m = T->model;
    const int64_t cap = m->c.head == DM_MODEL_HEAD_CLS ? m->c.layer.batch : m->c.sizes.predictions;
    m->loss_norm = T->optim.accumulate > 1 ? (double)cap * (double)dm_dist_size(m->dist) : 0.0;
}

dm_status dm_trainer_set_mlm_batch(dm_trainer *T, const int32_t *input_ids, const int32_t *token_type_ids,
                                   const float *attention_mask, const int32_t *labels) {
    if (!T || !input_ids || !labels) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_mlm_batch: NULL argument");
    if (!T->model) return dm_fail(DM_ERR_INVALID_ARG, "this trainer is a stack of layers, not a BERT");
    if (T->model->c.head != DM_MODEL_HEAD_MLM)
        return dm_fail(DM_ERR_INVALID_ARG, "this trainer is a sequence classifier: dm_trainer_set_cls_batch");
    set_loss_norm(T);
    return dm_model_set_batch(T->model, input_ids, token_type_ids, attention_mask, labels);
}

dm_status dm_trainer_set_cls_batch(dm_trainer *T, const int32_t *input_ids, const int32_t *token_type_ids,
                                   const float *attention_mask, const int32_t *labels) {
    if (!T || !input_ids || !labels) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_cls_batch: NULL argument");
    if (!T->model || T->model->c.head != DM_MODEL_HEAD_CLS)
        return dm_fail(DM_ERR_INVALID_ARG, "this trainer is not a sequence classifier (dm_bert_model.num_labels)");
    set_loss_norm(T);
    return dm_model_set_batch(T->model, input_ids, token_type_ids, attention_mask, labels);
}

int64_t dm_trainer_num_labels(const dm_trainer *T) {
    return T && T->model && T->model->c.head == DM_MODEL_HEAD_CLS ? T->model->c.sizes.classes : 0;
}

dm_status dm_trainer_mlm_stats(const dm_trainer *T, dm_mlm_stats *out) {
    if (!T || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_mlm_stats: NULL argument");
    if (!T->model) return dm_fail(DM_ERR_INVALID_ARG, "this trainer is a stack of layers, not a BERT");
    out->scored = T->model->counted_all;
    out->correct = T->model->correct;
    out->dropped = T->model->dropped;
    return DM_OK;
}

/* The slot of a BERT trainer's model name ("bert.encoder.layer.3.output.dense.weight"),
 * or -1. */
static int bert_slot(dm_trainer *T, const char *name) {
    const char *rest;
    dm_layer *L = route(T->model, name, &rest);
    for (int k = 0; L && k < T->nslots; k++)
        if (T->L[T->slot[k].seg] == L && !strcmp(T->slot[k].pname, rest)) return k;
    return -1;
}

dm_status dm_trainer_bert_tensor(dm_trainer *T, const char *name, float **data, int *ndim, int64_t shape[4]) {
    /* the tied decoder is the word table, its gradient and moments too */
    static const char dec[] = "cls.predictions.decoder.weight";
    char alias[192];
    if (T->model->c.head != DM_MODEL_HEAD_CLS && !strncmp(name, dec, sizeof dec - 1) && strlen(name) < 100) {
        snprintf(alias, sizeof alias, "bert.embeddings.word_embeddings.weight%s", name + sizeof dec - 1);
        name = alias;
    }
    const size_t n = strlen(name);
    const int moment = n > 8 && !strcmp(name + n - 8, ".exp_avg") ? 1 : n > 11 && !strcmp(name + n - 11, ".exp_avg_sq") ? 2 : 0;
    const int grad = !moment && n > 5 && !strcmp(name + n - 5, ".grad");
    char param[192];
    snprintf(param, sizeof param, "%.*s", (int)(n - (moment == 1 ? 8 : moment == 2 ? 11 : grad ? 5 : 0)), name);
    const int si = bert_slot(T, param);
    if (si >= 0 && T->broken) return dm_trainer_broken(T);
    if (si >= 0) {
        DM_TRY(dm_trainer_pull_slot(T, si));
        if (!grad) T->slot[si].dirty = 1;
    }
    if (!moment) return dm_model_tensor(T->model, name, data, ndim, shape);
    if (si < 0) return dm_fail(DM_ERR_NOT_FOUND, "no moments of '%s' in the trainer", param);
    const dm_train_slot *sl = &T->slot[si];
    if (!(*data = dm_slot_moments(T, sl, moment == 2, 0)))
        return dm_fail(DM_ERR_NOT_FOUND, "'%s': with ZeRO stage 1 rank %d keeps these moments, not this rank", name,
                       sl->owner);
    if (ndim) *ndim = sl->ndim;
    if (shape) shape[0] = sl->shape[0], shape[1] = sl->shape[1], shape[2] = shape[3] = 0;
    return DM_OK;
}

dm_status dm_trainer_bert_forward(dm_trainer *T, int64_t micro, double *loss) {
    double t0 = omp_get_wtime();
    DM_TRY(dm_trainer_push(T));
    DM_TRY(dm_model_forward(T->model, micro, loss, &T->model->correct));
    T->secs[DM_TRAIN_FORWARD] += omp_get_wtime() - t0;
    return DM_OK;
}

static dm_status reduce_after(void *ctx, int k) { return dm_trainer_reduce_segment(ctx, k); }

dm_status dm_trainer_bert_backward(dm_trainer *T) { return dm_model_backward_each(T->model, reduce_after, T); }

dm_status dm_trainer_evaluate(dm_trainer *T, double *loss) {
    if (!T) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_evaluate: NULL trainer");
    if (!T->model) return dm_fail(DM_ERR_UNSUPPORTED, "evaluation mode is a BERT trainer's (dm_trainer_new_bert)");
    if (T->broken) return dm_trainer_broken(T);
    dm_status s = DM_OK;
    for (int k = 0; s == DM_OK && k < T->nseg; k++) s = dm_layer_set_training(T->L[k], 0);
    if (s == DM_OK) s = dm_trainer_push(T);
    if (s == DM_OK) s = dm_model_forward(T->model, 0, loss, &T->model->correct);
    for (int k = 0; k < T->nseg; k++) {
        dm_status r = dm_layer_set_training(T->L[k], 1);
        if (s == DM_OK) s = r;
    }
    return s;
}

/* 1 when s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). */
static int utf8_ok(const unsigned char *s) {
    while (*s) {
        const unsigned c = *s;
        const int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4)) return 0;
        unsigned cp = len == 1 ? c : c & (0x7fu >> len);
        for (int k = 1; k < len; k++) {
            if ((s[k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[k] & 0x3fu);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        s += len;
    }
    return 1;
}

dm_status dm_trainer_set_label_names(dm_trainer *T, const char *const *names) {
    if (!T || !names) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_set_label_names: NULL argument");
    if (!T->model || T->model->c.head != DM_MODEL_HEAD_CLS)
        return dm_fail(DM_ERR_INVALID_ARG, "this trainer is not a sequence classifier: it has no labels to name");
    dm_model *m = T->model;
    const int64_t C = m->c.sizes.classes;
    char **v = calloc((size_t)C, sizeof *v);
    if (!v) return dm_fail(DM_ERR_OOM, "out of memory");
    for (int64_t k = 0; k < C; k++) {
        if (names[k] && (!names[k][0] || !utf8_ok((const unsigned char *)names[k]))) {
            for (int64_t j = 0; j < k; j++) free(v[j]);
            free(v);
            return dm_fail(DM_ERR_INVALID_ARG, "the name of label %lld is %s: give each class a name in UTF-8",
                           (long long)k, names[k][0] ? "not valid UTF-8" : "empty");
        }
        if (!names[k] || !(v[k] = strdup(names[k]))) {
            for (int64_t j = 0; j < k; j++) free(v[j]);
            free(v);
            return names[k] ? dm_fail(DM_ERR_OOM, "out of memory")
                            : dm_fail(DM_ERR_INVALID_ARG, "label %lld of %lld has no name", (long long)k, (long long)C);
        }
    }
    for (int64_t k = 0; m->label_names && k < C; k++) free(m->label_names[k]);
    free(m->label_names);
    m->label_names = v;
    return DM_OK;
}
