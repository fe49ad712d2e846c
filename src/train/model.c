/* model.c: a whole BertForMaskedLM as segments on one backend (model.h). */
#include "train/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
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
    o.no_input_grad = 0; /* every layer's input gradient feeds the segment before */
    if (s == DM_OK) s = dm_layer_new_segment(&m->emb, &c->layer, &o, DM_SEG_EMBEDDINGS, &c->sizes, m->pool);
    for (int l = 0; s == DM_OK && l < c->layers; l++) {
        s = dm_layer_new_pooled(&m->enc[l], &c->layer, &o, m->pool);
        if (s != DM_OK) dm_fail_context(s, "layer %d of %d: ", l, c->layers);
    }
    if (s == DM_OK) s = dm_layer_new_segment(&m->head, &c->layer, &o, DM_SEG_MLM_HEAD, &c->sizes, m->pool);
    /* the segments' passes are chained in the backend: waits once per pass */
    if (s == DM_OK) {
        m->emb->defer_wait = m->head->defer_wait = 1;
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
    free(m->enc);
    free(m);
}

/* The segment and its own name for a model name; NULL if there is none. */
static dm_layer *route(dm_model *m, const char *name, const char **rest) {
    static const char enc[] = "bert.encoder.layer.";
    if (!strncmp(name, "bert.embeddings.", 16)) {
        *rest = name + 5; /* "embeddings.*" */
        return m->emb;
    }
    if (!strncmp(name, "cls.", 4)) {
        *rest = name;
        return m->head;
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
    const char *rest;
    dm_layer *L = route(m, name, &rest);
    if (!L)
        return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the model (it has bert.embeddings.*, "
                       "bert.encoder.layer.<0..%d>.* and cls.predictions.*)", name, m->c.layers - 1);
    return dm_layer_tensor(L, rest, data, ndim, shape);
}

/* The seed of segment k (0 the embeddings, 1 .. L the layers, L + 1 the head) at step s:
 * the encoder layers' are the trainer's (dm_train_layer_seed of layer k - 1). */
static uint64_t segment_seed(const dm_model *m, int k, int64_t step) {
    return dm_train_layer_seed(m->c.layer.seed, k - 1, step);
}

dm_status dm_model_init_params(dm_model *m, uint64_t seed) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_init_params: NULL model");
    DM_TRY(dm_layer_init_params(m->emb, dm_train_layer_seed(seed, -1, 0)));
    for (int l = 0; l < m->c.layers; l++) DM_TRY(dm_layer_init_params(m->enc[l], dm_train_layer_seed(seed, l, 0)));
    return dm_layer_init_params(m->head, dm_train_layer_seed(seed, m->c.layers, 0));
}

/* The scored rows: the first `predictions` masked positions (labels >= 0) in order. */
static dm_status batch_head(dm_model *m, const int32_t *labels) {
    const int64_t n = m->c.layer.batch * m->c.layer.seq, M = m->c.sizes.predictions;
    float *mp, *lab, *w;
    DM_TRY(dm_layer_tensor(m->head, "masked_positions", &mp, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->head, "labels", &lab, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->head, "loss_weights", &w, NULL, NULL));
    int64_t k = 0, dropped = 0;
    for (int64_t r = 0; r < n; r++) {
        if (labels[r] < 0) continue;
        if (labels[r] >= m->c.sizes.vocab)
            return dm_fail(DM_ERR_INVALID_ARG, "label %d at position %lld is past the vocabulary of %lld", labels[r],
                           (long long)r, (long long)m->c.sizes.vocab);
        if (k == M) {
            dropped++;
            continue;
        }
        mp[k] = (float)r;
        lab[k++] = (float)labels[r];
    }
    m->counted = (int)k;
    m->dropped = dropped;
    for (int64_t r = 0; r < M; r++) {
        if (r >= k) mp[r] = 0.0f, lab[r] = -1.0f; /* a padding row: scored, but counts not */
        w[r] = r < k ? 1.0f / (float)k : 0.0f;
    }
    return DM_OK;
}

dm_status dm_model_set_batch(dm_model *m, const int32_t *ids, const int32_t *types, const float *attention_mask,
                             const int32_t *labels) {
    if (!m || !ids || !labels) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_set_batch: NULL argument");
    const int64_t B = m->c.layer.batch, J = m->c.layer.seq, n = B * J;
    float *in, *pos, *tt, *gid;
    DM_TRY(dm_layer_tensor(m->emb, "input_ids", &in, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->emb, "position_ids", &pos, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->emb, "token_type_ids", &tt, NULL, NULL));
    DM_TRY(dm_layer_tensor(m->emb, "word_grad_ids", &gid, NULL, NULL));
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= m->c.sizes.vocab)
            return dm_fail(DM_ERR_INVALID_ARG, "token id %d at position %lld is outside the vocabulary of %lld: "
                           "the data was made with another tokenizer", ids[r], (long long)r,
                           (long long)m->c.sizes.vocab);
        const int32_t t = types ? types[r] : 0;
        if (t < 0 || t >= m->c.sizes.types)
            return dm_fail(DM_ERR_INVALID_ARG, "token type %d at position %lld: the model has %lld types", t,
                           (long long)r, (long long)m->c.sizes.types);
        in[r] = (float)ids[r];
        gid[r] = ids[r] == m->c.pad_id ? -1.0f : (float)ids[r];
        pos[r] = (float)(r % J);
        tt[r] = (float)t;
    }
    for (int l = 0; l < m->c.layers; l++) {
        float *mask;
        DM_TRY(dm_layer_tensor(m->enc[l], "attention_mask", &mask, NULL, NULL));
        for (int64_t r = 0; r < n; r++) mask[r] = attention_mask ? attention_mask[r] : 1.0f;
    }
    return batch_head(m, labels);
}

/* Tensor src of segment a into tensor dst of segment b, in the backend. */
static dm_status link(const dm_model *m, dm_layer *a, const char *src, dm_layer *b, const char *dst) {
    const int ts = dm_layer_tensor_id(a, src), td = dm_layer_tensor_id(b, dst);
    if (ts < 0 || td < 0) return dm_fail(DM_ERR_INTERNAL, "model: no %s or %s to link", src, dst);
    return m->bk->copy_tensor(b->st, td, a->st, ts);
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

/* Argmax hits over the scored rows, from the logits (ties: the lowest id, as torch.argmax). */
static dm_status count_correct(dm_model *m, int64_t *correct) {
    float *lg, *lab;
    int64_t n;
    DM_TRY(down(m, m->head, "logits", &lg, &n));
    DM_TRY(dm_layer_tensor(m->head, "labels", &lab, NULL, NULL));
    const int64_t V = m->c.sizes.vocab;
    int64_t hits = 0;
    for (int64_t r = 0; r < m->counted; r++) {
        const float *row = lg + r * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        hits += best == (int64_t)lab[r];
    }
    *correct = hits;
    return DM_OK;
}

dm_status dm_model_forward(dm_model *m, int64_t step, double *loss, int64_t *correct) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_forward: NULL model");
    /* the tied decoder: the word table's values */
    DM_TRY(link(m, m->emb, "embeddings.word_embeddings.weight", m->head, "cls.predictions.decoder.weight"));
    DM_TRY(dm_layer_to_device(m->emb));
    for (int l = 0; l < m->c.layers; l++) DM_TRY(dm_layer_to_device(m->enc[l]));
    DM_TRY(dm_layer_to_device(m->head));
    DM_TRY(dm_layer_set_seed(m->emb, segment_seed(m, 0, step)));
    DM_TRY(dm_layer_forward(m->emb));
    DM_TRY(link(m, m->emb, "output", m->enc[0], "hidden_states"));
    for (int l = 0; l < m->c.layers; l++) {
        DM_TRY(dm_layer_set_seed(m->enc[l], segment_seed(m, l + 1, step)));
        DM_TRY(dm_layer_forward(m->enc[l]));
        DM_TRY(link(m, m->enc[l], "output", l + 1 < m->c.layers ? m->enc[l + 1] : m->head, "hidden_states"));
    }
    DM_TRY(dm_layer_forward(m->head));
    DM_TRY(m->bk->sync(m->head->st));
    float *rows;
    int64_t n;
    DM_TRY(down(m, m->head, "loss", &rows, &n));
    double sum = 0.0;
    for (int64_t r = 0; r < m->counted; r++) sum += rows[r];
    if (loss) *loss = m->counted ? sum / m->counted : 0.0;
    if (correct) DM_TRY(count_correct(m, correct));
    return DM_OK;
}

/* The decoder's gradient added into the word table's (the tie), on the host's memory. */
static dm_status tie_grads(dm_model *m) {
    float *a, *b;
    int64_t na, nb;
    DM_TRY(down(m, m->head, "cls.predictions.decoder.weight.grad", &b, &nb));
    DM_TRY(down(m, m->emb, "embeddings.word_embeddings.weight.grad", &a, &na));
    if (na != nb) return dm_fail(DM_ERR_INTERNAL, "the tied tables differ in size");
    for (int64_t e = 0; e < na; e++) a[e] += b[e];
    return m->bk->upload(m->emb->st, dm_layer_tensor_id(m->emb, "embeddings.word_embeddings.weight.grad"), a);
}

dm_status dm_model_backward(dm_model *m) {
    if (!m) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_backward: NULL model");
    DM_TRY(dm_layer_backward(m->head));
    DM_TRY(link(m, m->head, "grad_hidden_states", m->enc[m->c.layers - 1], "grad_output"));
    for (int l = m->c.layers - 1; l >= 0; l--) {
        DM_TRY(dm_layer_backward(m->enc[l]));
        DM_TRY(link(m, m->enc[l], "grad_hidden_states", l > 0 ? m->enc[l - 1] : m->emb, "grad_output"));
    }
    DM_TRY(dm_layer_backward(m->emb));
    DM_TRY(m->bk->sync(m->emb->st));
    return tie_grads(m);
}
