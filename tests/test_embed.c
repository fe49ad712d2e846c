/* test_embed.c: the inference API (dm_embedder) and whole-model loading, without network:
 * a BERT trainer's model (random weights, one step taken) exported and loaded into an
 * embedder gives the trainer's own hidden states in evaluation mode; mean and [CLS]
 * pooling and the L2 normalisation checked by hand; other lengths (buckets) and batch sizes
 * give the same embeddings as one padded batch; a BertModel-style file (no prefix, gamma and
 * beta, no cls.*), a sentence-transformers prefix and --layers-from load into a trainer,
 * the head left and noted; a checkpoint exported equals the trainer's export byte for
 * byte; bad input refused with nothing changed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "dmove.h"
#include "dmove_tools.h"
#include "testutil.h"
#include "train/model.h"
#include "train/trainer_internal.h"

enum { B = 3, J = 8, I = 16, V = 20, L = 2 };

static char g_dir[256];

static void config(dm_layer_config *c, dm_bert_model *bm) {
    dm_layer_config_default(c);
    c->batch = B, c->seq = J, c->hidden = I, c->heads = 2, c->ffn = 32, c->dropout = 0.1, c->seed = 3;
    c->act = DM_ACT_GELU;
    *bm = (dm_bert_model){.vocab = V, .positions = 32, .types = 2, .pad_id = 0};
}

/* The batch: rows of 8, 5 and 2 tokens ([CLS] 1 ... [SEP] 2), padding 0 after. */
static const int32_t k_ids[B * J] = {1, 5, 9, 3, 7, 11, 4, 2, 1, 6, 8, 13, 2, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0};
static const int32_t k_types[B * J] = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const int k_len[B] = {8, 5, 2};

static void mask_of(float *m, int seq) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < seq; t++) m[b * seq + t] = t < k_len[b] ? 1.0f : 0.0f;
}

/* A trainer, one step taken (so no parameter is at its initial value), exported to dir. */
static dm_trainer *trained(const char *dir) {
    dm_layer_config c;
    dm_bert_model bm;
    config(&c, &bm);
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &c, L, &bm, NULL, NULL));
    if (!T) return NULL;
    CHECK_OK(dm_trainer_init_params(T, 11));
    float m[B * J];
    mask_of(m, J);
    int32_t labels[B * J];
    for (int k = 0; k < B * J; k++) labels[k] = k % 5 == 1 ? k_ids[k] : -1;
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 1e-2;
    CHECK_OK(dm_trainer_set_optim(T, &a));
    CHECK_OK(dm_trainer_set_mlm_batch(T, k_ids, k_types, m, labels));
    double loss;
    CHECK_OK(dm_trainer_step(T, &loss));
    CHECK_OK(dm_trainer_export(T, dir));
    return T;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t k = 0; k < n; k++) {
        const double d = fabs((double)a[k] - (double)b[k]);
        if (!(d <= w)) w = d; /* NaN counts */
    }
    return w;
}

static dm_embedder *embedder(int64_t batch, int64_t seq, const char *dir) {
    dm_layer_config c;
    dm_bert_model bm;
    config(&c, &bm);
    c.batch = batch, c.seq = seq;
    dm_embedder *e = NULL;
    CHECK_OK(dm_embedder_new(&e, &c, L, &bm, NULL));
    if (e && dir) CHECK_OK(dm_embedder_load(e, dir, 0));
    return e;
}

/* The pooled embeddings by hand from hidden states (b, seq, I). */
static void pool_by_hand(const float *h, int seq, dm_pooling p, int normalize, double *out) {
    for (int b = 0; b < B; b++) {
        double norm = 0;
        for (int i = 0; i < I; i++) {
            double s = 0;
            const int n = p == DM_POOL_CLS ? 1 : k_len[b];
            for (int t = 0; t < n; t++) s += h[((size_t)b * seq + t) * I + i];
            out[b * I + i] = s / n;
            norm += out[b * I + i] * out[b * I + i];
        }
        for (int i = 0; normalize && i < I; i++) out[b * I + i] /= sqrt(norm);
    }
}

/* The exported model in an embedder: the trainer's hidden states (evaluation mode), the
 * pooling as by hand, other buckets and batch sizes the same. */
static void test_hidden_and_pooling(dm_trainer *T) {
    float m[B * J];
    mask_of(m, J);
    int32_t labels[B * J];
    for (int k = 0; k < B * J; k++) labels[k] = k == 3 ? 3 : -1;
    CHECK_OK(dm_trainer_set_mlm_batch(T, k_ids, k_types, m, labels));
    double loss;
    CHECK_OK(dm_trainer_evaluate(T, &loss));
    const float *ht = NULL, *he = NULL;
    CHECK_OK(dm_model_hidden(T->model, &ht));
    dm_embedder *e = embedder(B, J, g_dir);
    if (!e || !ht) return;
    CHECK(dm_embedder_hidden(e, &he) == DM_ERR_INVALID_ARG); /* nothing ran yet */
    CHECK_OK(dm_embedder_run(e, k_ids, k_types, m));
    CHECK_OK(dm_embedder_hidden(e, &he));
    const double dh = he ? max_diff(he, ht, (size_t)B * J * I) : 1.0;
    printf("exported and loaded: hidden states within %.2e of the trainer's (evaluation mode)\n", dh);
    CHECK(dh < 1e-5);
    float got[B * I];
    double want[B * I];
    for (int p = 0; p < 2; p++)
        for (int nz = 0; nz < 2; nz++) {
            CHECK_OK(dm_embedder_pool(e, (dm_pooling)p, nz, got));
            pool_by_hand(he, J, (dm_pooling)p, nz, want);
            double w = 0;
            for (int k = 0; k < B * I; k++) w = fmax(w, fabs(got[k] - want[k]));
            printf("  %s pooling%s: within %.2e of the sums by hand\n", dm_pooling_name((dm_pooling)p),
                   nz ? ", normalized" : "", w);
            CHECK(w < 1e-6);
        }
    /* the same sentences padded to 32 (another bucket), and one at a time (batch 1) */
    float ref[B * I], other[B * I];
    CHECK_OK(dm_embedder_pool(e, DM_POOL_MEAN, 0, ref));
    dm_embedder *big = embedder(B, 32, NULL), *one = embedder(1, 8, NULL);
    if (big && one) {
        CHECK_OK(dm_embedder_copy_params(big, e));
        CHECK_OK(dm_embedder_copy_params(one, e));
        int32_t ids[B * 32] = {0}, types[B * 32] = {0};
        float mk[B * 32];
        mask_of(mk, 32);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < J; t++) ids[b * 32 + t] = k_ids[b * J + t], types[b * 32 + t] = k_types[b * J + t];
        CHECK_OK(dm_embedder_run(big, ids, types, mk));
        CHECK_OK(dm_embedder_pool(big, DM_POOL_MEAN, 0, other));
        const double d32 = max_diff(other, ref, B * I);
        double d1 = 0;
        for (int b = 0; b < B; b++) {
            float row[I];
            CHECK_OK(dm_embedder_run(one, k_ids + b * J, k_types + b * J, m + b * J));
            CHECK_OK(dm_embedder_pool(one, DM_POOL_MEAN, 0, row));
            d1 = fmax(d1, max_diff(row, ref + b * I, I));
        }
        printf("  padded to 32 tokens: within %.2e; one sentence a batch: within %.2e\n", d32, d1);
        CHECK(d32 < 1e-5 && d1 < 1e-5);
    }
    dm_embedder_free(big);
    dm_embedder_free(one);
    dm_embedder_free(e);
}

static void test_bad_input(void) {
    dm_embedder *e = embedder(B, J, g_dir);
    if (!e) return;
    float m[B * J];
    mask_of(m, J);
    int32_t ids[B * J];
    memcpy(ids, k_ids, sizeof ids);
    ids[5] = V;
    CHECK(dm_embedder_run(e, ids, NULL, m) == DM_ERR_INVALID_ARG);
    int32_t types[B * J] = {0};
    types[2] = 2;
    CHECK(dm_embedder_run(e, k_ids, types, m) == DM_ERR_INVALID_ARG);
    m[4] = 0.5f;
    CHECK(dm_embedder_run(e, k_ids, NULL, m) == DM_ERR_INVALID_ARG);
    CHECK(dm_embedder_run(e, NULL, NULL, NULL) == DM_ERR_INVALID_ARG);
    float out[B * I];
    CHECK(dm_embedder_pool(e, DM_POOL_MEAN, 0, out) == DM_ERR_INVALID_ARG); /* the refused run left none */
    CHECK_OK(dm_embedder_run(e, k_ids, NULL, NULL));
    CHECK(dm_embedder_pool(e, (dm_pooling)7, 0, out) == DM_ERR_INVALID_ARG);
    dm_pooling p;
    CHECK(dm_pooling_parse("max", &p) == DM_ERR_INVALID_ARG);
    CHECK(dm_pooling_parse("cls", &p) == DM_OK && p == DM_POOL_CLS);
    float *t;
    CHECK(dm_embedder_tensor(e, "cls.predictions.bias", &t, NULL, NULL) == DM_ERR_NOT_FOUND);
    /* a model of other sizes: refused naming the tensor, the encoder unchanged */
    dm_layer_config c;
    dm_bert_model bm;
    config(&c, &bm);
    c.hidden = 8, c.ffn = 16;
    dm_embedder *small = NULL;
    CHECK_OK(dm_embedder_new(&small, &c, L, &bm, NULL));
    if (small) {
        float *w, before;
        CHECK_OK(dm_embedder_tensor(small, "bert.embeddings.word_embeddings.weight", &w, NULL, NULL));
        w[3] = 0.25f, before = w[3];
        char model[300];
        snprintf(model, sizeof model, "%s/model.safetensors", g_dir);
        const dm_status s = dm_embedder_load(small, model, 0);
        printf("  other sizes: %s\n", dm_last_error());
        CHECK(s == DM_ERR_SHAPE && strstr(dm_last_error(), "word_embeddings.weight' has shape (20, 16)") != NULL);
        CHECK(w[3] == before);
    }
    dm_embedder_free(small);
    dm_embedder_free(e);
}

/* A file made from the export: each tensor renamed by fn (NULL: left out). */
static void rewrite(const char *out, const char *(*fn)(const char *name, char *buf)) {
    char in[300];
    snprintf(in, sizeof in, "%s/model.safetensors", g_dir);
    dm_tensor_file *f = NULL;
    dm_tensor_writer *w = NULL;
    CHECK_OK(dm_tensor_file_open(&f, in));
    CHECK_OK(dm_tensor_writer_new(&w));
    for (int k = 0; f && w && k < dm_tensor_file_count(f); k++) {
        dm_tensor_info ti;
        CHECK_OK(dm_tensor_file_info(f, k, &ti));
        char buf[256];
        const char *name = fn(ti.name, buf);
        if (!name) continue;
        size_t n = 1;
        for (int d = 0; d < ti.ndim; d++) n *= (size_t)ti.shape[d];
        float *p = malloc(n * sizeof *p);
        CHECK_OK(dm_tensor_file_read_f32(f, k, p, n));
        CHECK_OK(dm_tensor_writer_add_f32(w, name, ti.ndim, ti.shape, p));
        free(p);
    }
    CHECK_OK(dm_tensor_writer_write(w, out));
    dm_tensor_writer_free(w);
    dm_tensor_file_free(f);
}

/* BertModel's names: no prefix, no head, the embeddings' LayerNorm as gamma and beta. */
static const char *as_bertmodel(const char *name, char *buf) {
    if (strncmp(name, "bert.", 5) != 0) return NULL;
    snprintf(buf, 256, "%s", name + 5);
    if (!strcmp(buf, "embeddings.LayerNorm.weight")) return "embeddings.LayerNorm.gamma";
    if (!strcmp(buf, "embeddings.LayerNorm.bias")) return "embeddings.LayerNorm.beta";
    return buf;
}
static const char *as_st(const char *name, char *buf) {
    if (strncmp(name, "bert.", 5) != 0) return NULL;
    snprintf(buf, 256, "0.auto_model.%s", name + 5);
    return buf;
}
static const char *without_layer1_key(const char *name, char *buf) {
    return strcmp(name, "bert.encoder.layer.1.attention.self.key.bias") ? name : NULL;
}

/* The export again with every tensor in f64 (each value exact), the word table in bf16
 * (rounded: 8 bits of mantissa). */
static void write_f64_bf16(const char *out) {
    char in[300];
    snprintf(in, sizeof in, "%s/model.safetensors", g_dir);
    dm_st_file *f = NULL;
    dm_st_writer *w = NULL;
    CHECK_OK(dm_st_read(in, &f));
    CHECK_OK(dm_st_writer_new(&w));
    for (int k = 0; f && w && k < dm_st_count(f); k++) {
        const dm_st_tensor *t = dm_st_get(f, k);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        float *p = malloc(n * sizeof *p);
        double *q = malloc(n * sizeof *q);
        uint16_t *h = malloc(n * sizeof *h);
        CHECK_OK(dm_st_to_f32(t, p, n));
        for (size_t e = 0; e < n; e++) {
            uint32_t u;
            memcpy(&u, &p[e], 4);
            q[e] = p[e], h[e] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
        }
        const int bf = strstr(t->name, "word_embeddings") != NULL;
        CHECK_OK(dm_st_writer_add(w, t->name, bf ? DM_ST_BF16 : DM_ST_F64, t->ndim, t->shape, bf ? (void *)h : (void *)q));
        free(p), free(q), free(h);
    }
    CHECK_OK(dm_st_writer_write(w, out));
    dm_st_writer_free(w);
    dm_st_free(f);
}

/* Every parameter of T equal to the exported trainer's (the head's only if `head`). */
static double param_diff(dm_trainer *T, dm_trainer *ref, int first, int head) {
    double w = 0;
    for (int s = 0; s < T->nslots; s++) {
        const dm_train_slot *sl = &T->slot[s];
        if (!head && T->L[sl->seg] == T->model->head) continue;
        const dm_layer *src = sl->seg >= 1 && sl->seg <= T->nlayers ? ref->L[sl->seg + first] : ref->L[sl->seg ? ref->nseg - 1 : 0];
        float *p = NULL;
        if (dm_layer_tensor((dm_layer *)src, sl->pname, &p, NULL, NULL) != DM_OK) return 1e9;
        w = fmax(w, max_diff(sl->p, p, (size_t)sl->n));
    }
    return w;
}

static void test_trainer_loads(dm_trainer *ref) {
    char path[300];
    dm_layer_config c;
    dm_bert_model bm;
    config(&c, &bm);
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &c, L, &bm, NULL, NULL));
    if (!T) return;
    CHECK_OK(dm_trainer_init_params(T, 5));
    float *hb, hb0;
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.transform.dense.bias", &hb, NULL, NULL));
    hb[0] = 0.5f, hb0 = hb[0];
    /* the whole BertForMaskedLM from the export directory */
    CHECK_OK(dm_trainer_load_params(T, g_dir));
    CHECK(param_diff(T, ref, 0, 1) == 0.0 && !strcmp(dm_trainer_load_note(T), ""));
    /* a BertModel: the head stays, and is noted */
    CHECK_OK(dm_trainer_init_params(T, 5));
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.transform.dense.bias", &hb, NULL, NULL));
    hb[0] = 0.5f;
    snprintf(path, sizeof path, "%s/bertmodel.safetensors", g_dir);
    rewrite(path, as_bertmodel);
    CHECK_OK(dm_trainer_load_params(T, path));
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.transform.dense.bias", &hb, NULL, NULL));
    printf("a BertModel file: encoder within %.1e, head left (%s)\n", param_diff(T, ref, 0, 0),
           dm_trainer_load_note(T));
    CHECK(param_diff(T, ref, 0, 0) == 0.0 && hb[0] == hb0);
    CHECK(strstr(dm_trainer_load_note(T), "cls.predictions.transform.dense.bias") != NULL);
    CHECK(strstr(dm_trainer_load_note(T), "decoder.weight") == NULL); /* the tied table is no head tensor */
    /* sentence-transformers' prefix */
    CHECK_OK(dm_trainer_init_params(T, 6));
    snprintf(path, sizeof path, "%s/st.safetensors", g_dir);
    rewrite(path, as_st);
    CHECK_OK(dm_trainer_load_params(T, path));
    CHECK(param_diff(T, ref, 0, 0) == 0.0);
    /* f64 and bf16 tensors: converted (f64 exactly, bf16 to its 8-bit mantissa) */
    CHECK_OK(dm_trainer_init_params(T, 7));
    snprintf(path, sizeof path, "%s/f64.safetensors", g_dir);
    write_f64_bf16(path);
    CHECK_OK(dm_trainer_load_params(T, path));
    {
        float *a = NULL, *b = NULL;
        CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.1.output.dense.weight", &a, NULL, NULL));
        CHECK_OK(dm_trainer_tensor(ref, "bert.encoder.layer.1.output.dense.weight", &b, NULL, NULL));
        CHECK(a && b && max_diff(a, b, (size_t)I * 32) == 0.0);
        CHECK_OK(dm_trainer_tensor(T, "bert.embeddings.word_embeddings.weight", &a, NULL, NULL));
        CHECK_OK(dm_trainer_tensor(ref, "bert.embeddings.word_embeddings.weight", &b, NULL, NULL));
        double rel = 0;
        for (int k = 0; a && b && k < V * I; k++) rel = fmax(rel, fabs(a[k] - b[k]) / (fabs(b[k]) + 1e-30));
        printf("  f64 tensors exact, the bf16 word table within %.2e relative\n", rel);
        CHECK(a && b && rel <= 1.0 / 256 && rel > 0);
    }
    /* a missing encoder tensor: refused naming it, nothing changed */
    float *wq, wq0;
    CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight", &wq, NULL, NULL));
    wq[0] += 1.0f, wq0 = wq[0];
    snprintf(path, sizeof path, "%s/holes.safetensors", g_dir);
    rewrite(path, without_layer1_key);
    CHECK(dm_trainer_load_params(T, path) == DM_ERR_NOT_FOUND);
    printf("  a file without a key bias: %s\n", dm_last_error());
    CHECK(strstr(dm_last_error(), "bert.encoder.layer.1.attention.self.key.bias") != NULL);
    CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight", &wq, NULL, NULL));
    CHECK(wq[0] == wq0);
    dm_trainer_free(T);
    /* --layers-from: one layer from the file's layer 1 */
    T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &c, 1, &bm, NULL, NULL));
    if (T) {
        CHECK_OK(dm_trainer_load_layers(T, g_dir, 1));
        CHECK(param_diff(T, ref, 1, 1) == 0.0);
        CHECK(dm_trainer_load_layers(T, g_dir, 2) == DM_ERR_NOT_FOUND);
    }
    dm_trainer_free(T);
}

/* A config.json that contradicts the tensors is refused naming the value. */
static void test_config_contradiction(void) {
    char dir[300], path[320];
    snprintf(dir, sizeof dir, "%s/bad", g_dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(mkdir(dir, 0755) == 0);
    rewrite(path, without_layer1_key); /* any file of the model: the config is read first */
    dm_hf_config hc;
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/config.json", g_dir);
    CHECK_OK(dm_hf_config_read(cfg, &hc));
    hc.num_hidden_layers = 3;
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    CHECK_OK(dm_hf_config_write(&hc, NULL, cfg));
    dm_embedder *e = embedder(B, J, NULL);
    if (e) {
        CHECK(dm_embedder_load(e, dir, 0) == DM_ERR_SHAPE);
        printf("  a config of 3 layers: %s\n", dm_last_error());
        CHECK(strstr(dm_last_error(), "num_hidden_layers") != NULL);
    }
    dm_embedder_free(e);
}

/* A forward-only model's encoder layers hold their activations once (dm_layer_act_share):
 * the same memory in every layer, none of it in a layer's own arena; a training model's
 * each its own. Nothing leaks through it: after batches of other lengths, a batch gives the
 * bits of a fresh forward-only model that ran only that batch, and (the layers before each
 * layer) the hidden states of the training model, whose layers share nothing, to float32
 * rounding (its plan differs), padded and unpadded. */
static void test_shared_activations(void) {
    dm_layer_config c;
    dm_bert_model bm;
    config(&c, &bm);
    c.dropout = 0.0;
    enum { NL = 3 };
    dm_model_config mc = {.layer = c, .layers = NL, .head = DM_MODEL_HEAD_NONE, .pad_id = bm.pad_id};
    mc.sizes = (dm_bert_sizes){.vocab = V, .positions = 32, .types = 2, .predictions = 1};
    /* a batch of long sentences, then one of short ones (B x J each) */
    int32_t ids_long[B * J], ids_short[B * J];
    float m_long[B * J], m_short[B * J];
    for (int k = 0; k < B * J; k++) {
        ids_long[k] = 1 + (k * 7) % (V - 1);
        m_long[k] = 1.0f;
        ids_short[k] = k % J < 1 + k / J ? 1 + (k * 5) % (V - 1) : 0;
        m_short[k] = k % J < 1 + k / J ? 1.0f : 0.0f;
    }
    for (int unpad = 0; unpad < 2; unpad++) {
        dm_layer_options o = {.forward_only = 1, .unpad = unpad};
        dm_model *used = NULL, *fresh = NULL, *train = NULL;
        CHECK_OK(dm_model_new(&used, &mc, &o));
        CHECK_OK(dm_model_new(&fresh, &mc, &o));
        dm_layer_options ot = {.unpad = unpad};
        CHECK_OK(dm_model_new(&train, &mc, &ot));
        if (!used || !fresh || !train) {
            dm_model_free(used), dm_model_free(fresh), dm_model_free(train);
            return;
        }
        int shared = used->share.mem != NULL;
        for (int l = 0; l < NL; l++) {
            const dm_layer *Ly = used->enc[l], *Lt = train->enc[l];
            const size_t own = Ly->plan.arena_bytes - Ly->plan.activation_bytes;
            shared = shared && Ly->act == used->share.mem && Ly->arena_bytes < Ly->plan.arena_bytes &&
                     Ly->arena_bytes >= own && Lt->act == Lt->arena + (Lt->plan.arena_bytes - Lt->plan.activation_bytes);
        }
        printf("%s forward-only model of %d layers: activations %s (%zu bytes, once; a layer's own arena %zu of %zu)\n",
               unpad ? "unpadded" : "padded", NL, shared ? "shared" : "NOT SHARED", used->share.bytes,
               used->enc[0]->arena_bytes, used->enc[0]->plan.arena_bytes);
        CHECK(shared && train->share.mem == NULL);
        CHECK_OK(dm_model_init_params(used, 5));
        CHECK_OK(dm_model_init_params(fresh, 5));
        CHECK_OK(dm_model_init_params(train, 5));
        const float *h = NULL;
        float *after = malloc(sizeof(float) * B * J * I), *alone = malloc(sizeof(float) * B * J * I);
        CHECK_OK(dm_model_set_batch(used, ids_long, NULL, m_long, NULL));
        CHECK_OK(dm_model_forward(used, 0, NULL, NULL));
        CHECK_OK(dm_model_set_batch(used, ids_short, NULL, m_short, NULL));
        CHECK_OK(dm_model_forward(used, 0, NULL, NULL));
        CHECK_OK(dm_model_hidden(used, &h));
        if (h && after) memcpy(after, h, sizeof(float) * B * J * I);
        CHECK_OK(dm_model_set_batch(fresh, ids_short, NULL, m_short, NULL));
        CHECK_OK(dm_model_forward(fresh, 0, NULL, NULL));
        h = NULL;
        CHECK_OK(dm_model_hidden(fresh, &h));
        if (h && alone) memcpy(alone, h, sizeof(float) * B * J * I);
        const int same = h && after && alone && !memcmp(after, alone, sizeof(float) * B * J * I);
        printf("  the short batch after a long one: %s that of a model that ran it alone\n",
               same ? "bit-identical to" : "DIFFERS from");
        CHECK(same);
        CHECK_OK(dm_model_set_batch(train, ids_short, NULL, m_short, NULL));
        CHECK_OK(dm_model_forward(train, 0, NULL, NULL));
        h = NULL;
        CHECK_OK(dm_model_hidden(train, &h));
        const double dt = h && after ? max_diff(after, h, (size_t)B * J * I) : 1.0;
        printf("  and within %.2e of the training model's (no layer sharing)\n", dt);
        CHECK(dt < 1e-5);
        free(after), free(alone);
        dm_model_free(used), dm_model_free(fresh), dm_model_free(train);
    }
}

/* dm_checkpoint_export of a checkpoint: the trainer's export, byte for byte. */
static void test_checkpoint_export(dm_trainer *T) {
    char ck[300], out[300], a[320], b[320];
    snprintf(ck, sizeof ck, "%s/run.ckpt", g_dir);
    snprintf(out, sizeof out, "%s/from-ckpt", g_dir);
    CHECK_OK(dm_trainer_save(T, ck));
    CHECK_OK(dm_checkpoint_export(ck, out));
    for (int k = 0; k < 2; k++) {
        const char *f = k ? "config.json" : "model.safetensors";
        snprintf(a, sizeof a, "%s/%s", g_dir, f);
        snprintf(b, sizeof b, "%s/%s", out, f);
        FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
        int same = fa && fb;
        for (int x = 0, y = 0; same && (x != EOF || y != EOF);) {
            x = fgetc(fa), y = fgetc(fb);
            same = x == y;
        }
        if (fa) fclose(fa);
        if (fb) fclose(fb);
        printf("checkpoint exported: %s %s the trainer's\n", f, same ? "is byte-identical to" : "DIFFERS from");
        CHECK(same);
    }
    CHECK(dm_checkpoint_export(a, out) != DM_OK); /* a config.json is no checkpoint */
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/dmove_test_embed.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
    dm_trainer *T = trained(g_dir);
    if (T) {
        test_hidden_and_pooling(T);
        test_bad_input();
        test_trainer_loads(T);
        test_config_contradiction();
        test_checkpoint_export(T);
    }
    test_shared_activations();
    dm_trainer_free(T);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
    TEST_END();
}
