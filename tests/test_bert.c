/* test_bert.c: the parts of a whole BERT beside its encoder layers (graph/bert.c), each
 * compiled and run as a layer (dm_layer_new_segment) on every registered backend that
 * runs them, against transformers' BertEmbeddings and BertOnlyMLMHead
 * (tests/ref/make_bert_ref.py): the embeddings' output with dropout (dmove's Philox mask)
 * and every parameter gradient; the MLM head's per-row cross-entropy over the masked
 * positions (padding rows ignored), the gradient of hidden_states (scattered back to the
 * rows that were gathered) and of every head parameter; both schedules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "testutil.h"

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

static const dm_st_file *g_ref;

static int64_t meta(const char *k) {
    const char *v = dm_st_metadata(g_ref, k);
    CHECK(v != NULL);
    return v ? strtoll(v, NULL, 10) : 0;
}

/* Reference tensor `name` into the layer's tensor `into` (same element count). */
static void put(dm_layer *L, const char *into, const char *name) {
    float *p;
    int nd;
    int64_t sh[4];
    CHECK_OK(dm_layer_tensor(L, into, &p, &nd, sh));
    const dm_st_tensor *t = dm_st_find(g_ref, name);
    CHECK(t != NULL);
    if (!t) return;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    CHECK_OK(dm_st_to_f32(t, p, (size_t)n));
}

/* The relative error (max |a - b| / max |b|) of the layer's tensor against the reference's. */
static double err_of(dm_layer *L, const char *mine, const char *ref) {
    float *p;
    int nd;
    int64_t sh[4];
    if (dm_layer_tensor(L, mine, &p, &nd, sh) != DM_OK) return INFINITY;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    float *want = malloc((size_t)n * sizeof(float));
    const dm_st_tensor *t = dm_st_find(g_ref, ref);
    double e = INFINITY;
    if (want && t && dm_st_to_f32(t, want, (size_t)n) == DM_OK) e = rel_err(p, want, (size_t)n);
    free(want);
    return e;
}

static dm_layer_config parts_config(void) {
    dm_layer_config c;
    dm_layer_config_default(&c);
    c.batch = meta("b"), c.seq = meta("j"), c.hidden = meta("i"), c.heads = 2, c.ffn = 4 * c.hidden;
    c.seed = (uint64_t)meta("seed");
    c.dropout = 0.1;
    return c;
}

static dm_bert_sizes parts_sizes(void) {
    dm_bert_sizes s = {.vocab = meta("vocab"), .positions = meta("positions"), .types = meta("types"),
                       .predictions = meta("predictions")};
    return s;
}

static const char *const k_emb_params[5] = {
    "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"};

static void test_embeddings(const dm_layer_options *opt) {
    const dm_layer_config cfg = parts_config();
    const dm_bert_sizes sz = parts_sizes();
    dm_layer *L = NULL;
    CHECK_OK(dm_layer_new_segment(&L, &cfg, opt, DM_SEG_EMBEDDINGS, &sz, NULL));
    if (!L) return;
    CHECK(dm_layer_num_params(L) == 5);
    char name[128];
    for (int k = 0; k < 5; k++) {
        snprintf(name, sizeof name, "emb.%s", k_emb_params[k]);
        put(L, k_emb_params[k], name);
    }
    put(L, "input_ids", "emb.input_ids");
    put(L, "token_type_ids", "emb.token_type_ids");
    put(L, "position_ids", "emb.position_ids");
    put(L, "grad_output", "emb.grad_output");
    /* the padding id's (0) row of the word table takes no gradient (padding_idx) */
    float *ids, *gids;
    CHECK_OK(dm_layer_tensor(L, "input_ids", &ids, NULL, NULL));
    CHECK_OK(dm_layer_tensor(L, "word_grad_ids", &gids, NULL, NULL));
    for (int64_t r = 0; r < cfg.batch * cfg.seq; r++) gids[r] = ids[r] == 0.0f ? -1.0f : ids[r];
    CHECK_OK(dm_layer_to_device(L));
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));
    CHECK_OK(dm_layer_to_host(L));
    double worst = err_of(L, "output", "emb.expected.output");
    const double eo = worst;
    for (int k = 0; k < 5; k++) {
        char mine[128];
        snprintf(mine, sizeof mine, "%s.grad", k_emb_params[k]);
        snprintf(name, sizeof name, "emb.expected.%s.grad", k_emb_params[k]);
        const double e = err_of(L, mine, name);
        worst = worst_of(worst, e);
    }
    printf("embeddings (%s, %s, dropout 0.1): output within %.2e, output and 5 gradients within %.2e\n",
           dm_device_kind_name(opt->device), opt->schedule == DM_SCHED_FUSED ? "fused" : "unfused", eo, worst);
    CHECK(worst < 2e-5);
    dm_layer_free(L);
}

static const char *const k_head_params[6] = {
    "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.decoder.weight", "cls.predictions.bias"};

static void test_head(const dm_layer_options *opt) {
    const dm_layer_config cfg = parts_config();
    const dm_bert_sizes sz = parts_sizes();
    dm_layer *L = NULL;
    CHECK_OK(dm_layer_new_segment(&L, &cfg, opt, DM_SEG_MLM_HEAD, &sz, NULL));
    if (!L) return;
    char name[128];
    for (int k = 0; k < 6; k++) {
        snprintf(name, sizeof name, "head.%s", k_head_params[k]);
        put(L, k_head_params[k], name);
    }
    put(L, "hidden_states", "head.hidden_states");
    put(L, "masked_positions", "head.masked_positions");
    put(L, "labels", "head.labels");
    /* the mean over the rows that count: each counted row's weight 1 / count */
    float *lab, *w;
    CHECK_OK(dm_layer_tensor(L, "labels", &lab, NULL, NULL));
    CHECK_OK(dm_layer_tensor(L, "loss_weights", &w, NULL, NULL));
    int count = 0;
    for (int64_t r = 0; r < sz.predictions; r++) count += lab[r] >= 0;
    for (int64_t r = 0; r < sz.predictions; r++) w[r] = lab[r] >= 0 ? 1.0f / (float)count : 0.0f;
    CHECK_OK(dm_layer_to_device(L));
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));
    CHECK_OK(dm_layer_to_host(L));
    float *loss;
    CHECK_OK(dm_layer_tensor(L, "loss", &loss, NULL, NULL));
    double mean = 0.0;
    for (int64_t r = 0; r < sz.predictions; r++) mean += lab[r] >= 0 ? loss[r] / count : 0.0;
    float want = 0.0f;
    const dm_st_tensor *t = dm_st_find(g_ref, "head.expected.loss");
    CHECK(t && dm_st_to_f32(t, &want, 1) == DM_OK);
    const double el = fabs(mean - want) / want, er = err_of(L, "loss", "head.expected.loss_rows");
    double worst = err_of(L, "grad_hidden_states", "head.expected.grad_hidden_states");
    for (int k = 0; k < 6; k++) {
        char mine[128];
        snprintf(mine, sizeof mine, "%s.grad", k_head_params[k]);
        snprintf(name, sizeof name, "head.expected.%s.grad", k_head_params[k]);
        const double e = err_of(L, mine, name);
        worst = worst_of(worst, e);
    }
    printf("MLM head (%s, %s, %lld rows scored, 2 of them padding): loss %.6f within %.2e, per-row losses within "
           "%.2e, grad_hidden_states and 6 gradients within %.2e\n", dm_device_kind_name(opt->device),
           opt->schedule == DM_SCHED_FUSED ? "fused" : "unfused", (long long)sz.predictions, mean, el, er, worst);
    CHECK(el < 1e-6 && er < 1e-5 && worst < 2e-5);
    /* the rows never gathered get no gradient */
    float *gh;
    CHECK_OK(dm_layer_tensor(L, "grad_hidden_states", &gh, NULL, NULL));
    CHECK(gh[1 * cfg.hidden] == 0.0f && gh[(cfg.batch * cfg.seq - 2) * cfg.hidden] == 0.0f);
    dm_layer_free(L);
}

static void test_refusals(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32;
    dm_bert_sizes sz = {.vocab = 30, .positions = 4, .types = 2, .predictions = 3};
    dm_layer *L = NULL;
    CHECK(dm_layer_new_segment(&L, &cfg, NULL, DM_SEG_EMBEDDINGS, &sz, NULL) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "max_position_embeddings"));
    sz.positions = 8, sz.predictions = 17;
    CHECK(dm_layer_new_segment(&L, &cfg, NULL, DM_SEG_MLM_HEAD, &sz, NULL) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "masked positions"));
    CHECK(dm_layer_new_segment(&L, &cfg, NULL, DM_SEG_MLM_HEAD, NULL, NULL) == DM_ERR_INVALID_ARG);
    CHECK(L == NULL);
}

int main(void) {
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(REF_DIR "/bert_parts.safetensors", &f));
    if (!f) TEST_END();
    g_ref = f;
    for (int s = 0; s < 2; s++) {
        dm_layer_options o = {.schedule = s ? DM_SCHED_UNFUSED : DM_SCHED_FUSED};
        test_embeddings(&o);
        test_head(&o);
    }
    test_refusals();
#ifdef DM_HAVE_CUDA
    /* the CUDA backend (emulated without a GPU: DMOVE_CUDA_EMULATE unless set): the same
     * segments, fp32, the same tolerances */
    {
        setenv("DMOVE_CUDA_EMULATE", "1", 0);
        for (int s = 0; s < 2; s++) {
            dm_layer_options o = {.device = DM_DEVICE_CUDA, .schedule = s ? DM_SCHED_UNFUSED : DM_SCHED_FUSED};
            test_embeddings(&o);
            test_head(&o);
        }
    }
#endif
    dm_st_free(f);
    TEST_END();
}
