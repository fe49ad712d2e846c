/* infer.c: a BERT without a head, forward only: hidden states and sentence embeddings
 * (dmove.h: dm_embedder). A dm_model of DM_MODEL_HEAD_NONE made forward-only, dropout 0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "layer/layer_internal.h"
#include "train/hfload.h"
#include "train/model.h"

struct dm_embedder {
    dm_model *m;
    float *mask;   /* the last run's attention mask (b * j) */
    int dirty;     /* parameters written on the host since the last run */
    int ran;       /* a run since the last change */
};

const char *dm_pooling_name(dm_pooling p) { return p == DM_POOL_CLS ? "cls" : "mean"; }

dm_status dm_pooling_parse(const char *s, dm_pooling *out) {
    if (!s || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_pooling_parse: NULL argument");
    if (!strcmp(s, "mean")) *out = DM_POOL_MEAN;
    else if (!strcmp(s, "cls")) *out = DM_POOL_CLS;
    else return dm_fail(DM_ERR_INVALID_ARG, "pooling '%s': give mean (sentence-transformers' default) or cls", s);
    return DM_OK;
}

dm_status dm_embedder_new(dm_embedder **out, const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                         const dm_layer_options *opt) {
    if (!out || !cfg || !bert) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_new: NULL argument");
    *out = NULL;
    dm_layer_config c = *cfg;
    c.dropout = 0.0; /* inference */
    DM_TRY(dm_layer_config_check(&c));
    dm_layer_options o = {0};
    if (opt) o = *opt;
    o.forward_only = 1;
    dm_model_config mc = {.layer = c, .layers = layers, .head = DM_MODEL_HEAD_NONE, .pad_id = bert->pad_id};
    mc.sizes = (dm_bert_sizes){.vocab = bert->vocab, .positions = bert->positions, .types = bert->types,
                               .predictions = 1};
    dm_embedder *e = calloc(1, sizeof *e);
    if (!e) return dm_fail(DM_ERR_OOM, "out of memory");
    const size_t n = (size_t)c.batch * (size_t)c.seq; /* checked by the config */
    dm_status s = (e->mask = malloc(n * sizeof(float))) ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) s = dm_model_new(&e->m, &mc, &o);
    if (s != DM_OK) {
        dm_embedder_free(e);
        return s;
    }
    e->dirty = 1;
    *out = e;
    return DM_OK;
}

void dm_embedder_free(dm_embedder *e) {
    if (!e) return;
    dm_model_free(e->m);
    free(e->mask);
    free(e);
}

int64_t dm_embedder_batch(const dm_embedder *e) { return e ? e->m->c.layer.batch : 0; }
int64_t dm_embedder_seq(const dm_embedder *e) { return e ? e->m->c.layer.seq : 0; }
int64_t dm_embedder_hidden_size(const dm_embedder *e) { return e ? e->m->c.layer.hidden : 0; }

dm_status dm_embedder_init_params(dm_embedder *e, uint64_t seed) {
    if (!e) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_init_params: NULL encoder");
    e->dirty = 1, e->ran = 0;
    return dm_model_init_params(e->m, seed);
}

dm_status dm_embedder_load(dm_embedder *e, const char *path, int first) {
    if (!e || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_load: NULL argument");
    e->dirty = 1, e->ran = 0;
    return dm_model_load_path(e->m, path, first, 0, NULL, 0);
}

/* Segment k of a model: 0 the embeddings, 1 .. L the layers. */
static dm_layer *segment(const dm_model *m, int k) { return k == 0 ? m->emb : m->enc[k - 1]; }

dm_status dm_embedder_copy_params(dm_embedder *dst, const dm_embedder *src) {
    if (!dst || !src) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_copy_params: NULL argument");
    const dm_model_config *a = &dst->m->c, *b = &src->m->c;
    if (a->layers != b->layers || a->layer.hidden != b->layer.hidden || a->layer.ffn != b->layer.ffn ||
        a->sizes.vocab != b->sizes.vocab || a->sizes.positions != b->sizes.positions ||
        a->sizes.types != b->sizes.types)
        return dm_fail(DM_ERR_SHAPE, "dm_embedder_copy_params: the two encoders are not of the same model");
    for (int k = 0; k <= a->layers; k++) {
        dm_layer *D = segment(dst->m, k), *S = segment(src->m, k);
        for (int q = 0; q < dm_layer_num_params(D); q++) {
            const char *name = dm_layer_param_name(D, q);
            float *pd, *ps;
            int nd;
            int64_t sh[4];
            DM_TRY(dm_layer_tensor(D, name, &pd, &nd, sh));
            DM_TRY(dm_layer_tensor(S, name, &ps, NULL, NULL));
            memcpy(pd, ps, (size_t)(nd == 1 ? sh[0] : sh[0] * sh[1]) * sizeof(float));
        }
    }
    dst->dirty = 1, dst->ran = 0;
    return DM_OK;
}

dm_status dm_embedder_tensor(dm_embedder *e, const char *name, float **data, int *ndim, int64_t shape[4]) {
    if (!e || !name || !data) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_tensor: NULL argument");
    if (strncmp(name, "bert.", 5) != 0)
        return dm_fail(DM_ERR_NOT_FOUND, "no tensor named '%s' in the encoder (it has bert.embeddings.* and "
                       "bert.encoder.layer.<l>.*)", name);
    DM_TRY(dm_model_tensor(e->m, name, data, ndim, shape));
    e->dirty = 1;
    return DM_OK;
}

/* The parameters written on the host to the backend (on the CPU, the same memory). */
static dm_status push_params(dm_embedder *e) {
    const dm_model *m = e->m;
    for (int k = 0; k <= m->c.layers; k++) {
        dm_layer *L = segment(m, k);
        for (int q = 0; q < dm_layer_num_params(L); q++) {
            const char *name = dm_layer_param_name(L, q);
            float *p;
            DM_TRY(dm_layer_tensor(L, name, &p, NULL, NULL));
            DM_TRY(m->bk->upload(L->st, dm_layer_tensor_id(L, name), p));
        }
    }
    e->dirty = 0;
    return DM_OK;
}

dm_status dm_embedder_run(dm_embedder *e, const int32_t *ids, const int32_t *types, const float *mask) {
    if (!e || !ids) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_run: NULL argument");
    const int64_t n = e->m->c.layer.batch * e->m->c.layer.seq;
    for (int64_t r = 0; mask && r < n; r++)
        if (!(mask[r] == 0.0f || mask[r] == 1.0f))
            return dm_fail(DM_ERR_INVALID_ARG, "attention mask value %g at position %lld: give 1 (a token) or 0 "
                           "(padding)", (double)mask[r], (long long)r);
    e->ran = 0;
    DM_TRY(dm_model_set_batch(e->m, ids, types, mask, NULL));
    for (int64_t r = 0; r < n; r++) e->mask[r] = mask ? mask[r] : 1.0f;
    if (e->dirty) DM_TRY(push_params(e));
    DM_TRY(dm_model_forward(e->m, 0, NULL, NULL));
    e->ran = 1;
    return DM_OK;
}

dm_status dm_embedder_hidden(dm_embedder *e, const float **hidden) {
    if (!e || !hidden) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_hidden: NULL argument");
    if (!e->ran) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_hidden: no batch has run (dm_embedder_run)");
    return dm_model_hidden(e->m, hidden);
}

dm_status dm_embedder_pool(dm_embedder *e, dm_pooling pooling, int normalize, float *out) {
    if (!e || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_embedder_pool: NULL argument");
    if (pooling != DM_POOL_MEAN && pooling != DM_POOL_CLS)
        return dm_fail(DM_ERR_INVALID_ARG, "pooling %d: DM_POOL_MEAN or DM_POOL_CLS", (int)pooling);
    const float *h;
    DM_TRY(dm_embedder_hidden(e, &h));
    const int64_t B = e->m->c.layer.batch, J = e->m->c.layer.seq, I = e->m->c.layer.hidden;
    double *acc = malloc((size_t)I * sizeof *acc);
    if (!acc) return dm_fail(DM_ERR_OOM, "out of memory");
    for (int64_t b = 0; b < B; b++) {
        const float *hb = h + b * J * I;
        const float *mb = e->mask + b * J;
        double kept = 0.0;
        for (int64_t i = 0; i < I; i++) acc[i] = 0.0;
        if (pooling == DM_POOL_CLS) {
            for (int64_t i = 0; i < I; i++) acc[i] = hb[i];
            kept = 1.0;
        } else {
            for (int64_t t = 0; t < J; t++) {
                if (mb[t] == 0.0f) continue;
                kept += 1.0;
                for (int64_t i = 0; i < I; i++) acc[i] += hb[t * I + i];
            }
        }
        /* sentence-transformers divides by max(count, 1e-9): a row with no token is 0 */
        const double div = kept > 1e-9 ? kept : 1e-9;
        double norm = 0.0;
        for (int64_t i = 0; i < I; i++) {
            acc[i] /= div;
            norm += acc[i] * acc[i];
        }
        norm = sqrt(norm);
        const double scale = normalize ? 1.0 / (norm > 1e-12 ? norm : 1e-12) : 1.0;
        for (int64_t i = 0; i < I; i++) out[b * I + i] = (float)(acc[i] * scale);
    }
    free(acc);
    return DM_OK;
}
