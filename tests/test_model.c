/* test_model.c: one step of a whole BertForMaskedLM (train/model.c: embeddings, encoder
 * layers, MLM head, the decoder tied to the word table) against PyTorch in float64
 * (tests/ref/make_model_ref.py): four small configurations (layers, sizes, heads,
 * activations, eps, padding ids, token types), case A without dropout, B-D with dropout
 * 0.1-0.2 (dmove's masks; each configuration checked there to be transformers' own model
 * at dropout 0); padding, a [PAD] id inside the text, masked positions of which one is
 * left out: the loss, the argmax hits and every parameter's gradient, both schedules, the
 * MLM head's decoder and cross-entropy fused (LINEAR_XENT: the hits from its argmax ids)
 * and not, and auto (unfused); the same on the CUDA backend (emulated without a GPU;
 * SKIP in a build without it) in fp32 and in bf16 storage (the fp32 references at a
 * bf16 tolerance). Then a headless forward-only model, learning, evaluation mode and
 * resume. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/philox.h"
#include "core/safetensors.h"
#include "dmove.h"
#include "dmove_tools.h"
#include "testutil.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "train/model.h"
#include "train/trainer_internal.h"

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

static const dm_st_file *g_ref;

/* The backend of run_case (the CPU's unless set), and the tolerances of its loss and
 * gradients (a CUDA run with 16-bit storage: bf16's) */
static dm_layer_options g_opt;
static double g_tol_loss = 1e-5, g_tol_grad = 1e-4, g_tol_zero = 1e-6, g_tol_all = 1e-4;
static int g_zero_vs_query; /* the key bias's gradient against the query bias's, not absolute */
static double g_all[2];     /* each_param: the squared error of every gradient, the squared norm */

/* Case cs's configuration value k ("<cs>.<k>" in the metadata). */
static const char *meta_s(const char *cs, const char *k) {
    char key[32];
    snprintf(key, sizeof key, "%s.%s", cs, k);
    const char *v = dm_st_metadata(g_ref, key);
    CHECK(v != NULL);
    return v ? v : "0";
}
static int64_t meta(const char *cs, const char *k) { return strtoll(meta_s(cs, k), NULL, 10); }

static float *ref_f32(const char *name, int64_t n) {
    const dm_st_tensor *t = dm_st_find(g_ref, name);
    float *p = malloc((size_t)n * sizeof(float));
    CHECK(t != NULL && p != NULL);
    if (!t || !p || dm_st_to_f32(t, p, (size_t)n) != DM_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* Every parameter of the reference (its names: bert.*, cls.*) into the model; with
 * `grads`, the largest relative error of the model's gradients instead. */
static double each_param(dm_model *m, const char *cs, int grads, const char **worst_name) {
    double worst = 0.0;
    for (int k = 0; k < dm_st_count(g_ref); k++) {
        const dm_st_tensor *t = dm_st_get(g_ref, k);
        char prefix[8];
        snprintf(prefix, sizeof prefix, "%s.", cs);
        if (strncmp(t->name, prefix, 2) != 0) continue;
        const char *name = t->name + 2;
        if (strncmp(name, "bert.", 5) != 0 && strncmp(name, "cls.", 4) != 0) continue;
        float *p;
        int nd;
        int64_t sh[4];
        char mine[192];
        snprintf(mine, sizeof mine, "%s%s", name, grads ? ".grad" : "");
        if (dm_model_tensor(m, mine, &p, &nd, sh) != DM_OK) {
            printf("  no %s in the model: %s\n", mine, dm_last_error());
            CHECK(0);
            continue;
        }
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= sh[d];
        if (!grads) {
            CHECK_OK(dm_st_to_f32(t, p, (size_t)n));
            continue;
        }
        char ref[224];
        snprintf(ref, sizeof ref, "%s.expected.%s.grad", cs, name);
        float *want = ref_f32(ref, n);
        double e = want ? rel_err(p, want, (size_t)n) : INFINITY;
        if (want && g_zero_vs_query && strstr(name, "attention.self.query.bias")) {
            /* 16-bit storage: the query bias's gradient is a sum over the tokens of dQ rows
             * that cancel (each row of dS sums to zero), so its size can be a fraction of
             * the terms' whose rounding it carries (seen: a fifth of the query weight's
             * gradient per column, 1.1e-1 relative error in bf16 where the same model with
             * other dropout masks gave 3e-2): its error against the larger of its own size
             * and the query weight's gradient per input column (the fp32 runs of the same
             * kernels still hold it to 1e-4 of its own size) */
            char wn[224];
            snprintf(wn, sizeof wn, "%s.expected.%.*squery.weight.grad", cs, (int)(strstr(name, "query.bias") - name), name);
            const int64_t nw = n * n; /* the query weight: i x i */
            float *ww = ref_f32(wn, nw);
            double d = 0, r = 0, rw = 0;
            for (int64_t q = 0; q < n; q++) d += ((double)p[q] - want[q]) * ((double)p[q] - want[q]), r += (double)want[q] * want[q];
            for (int64_t q = 0; ww && q < nw; q++) rw += (double)ww[q] * ww[q];
            e = ww ? sqrt(d) / fmax(sqrt(r), sqrt(rw / (double)n)) : INFINITY;
            free(ww);
        }
        for (int64_t q = 0; want && q < n && !strstr(name, "attention.self.key.bias"); q++)
            g_all[0] += ((double)p[q] - want[q]) * ((double)p[q] - want[q]), g_all[1] += (double)want[q] * want[q];
        if (want && strstr(name, "attention.self.key.bias")) {
            /* zero in exact arithmetic (softmax does not see a shift of all scores): its
             * size against the query bias's gradient, not its relative error */
            double big = 0.0;
            for (int64_t q = 0; q < n; q++) big = fmax(big, fabs(p[q]));
            if (g_zero_vs_query) { /* 16-bit storage: rounding noise, against the query bias's gradient */
                char qn[224];
                snprintf(qn, sizeof qn, "%s.expected.%.*squery.bias.grad", cs, (int)(strstr(name, "key.bias") - name), name);
                float *wq = ref_f32(qn, n);
                double qmax = 0.0;
                for (int64_t q = 0; wq && q < n; q++) qmax = fmax(qmax, fabs(wq[q]));
                big = wq && qmax > 0 ? big / qmax : INFINITY;
                free(wq);
            }
            e = big < g_tol_zero ? 0.0 : INFINITY;
        }
        if (!(e <= worst)) worst = worst_of(worst, e), *worst_name = name;
        free(want);
    }
    return worst;
}

/* Every segment of the model to the device (to = 1) or its results to the host. */
static void segments_copy(dm_model *m, int to) {
    dm_layer *seg[2] = {m->emb, m->head};
    for (int l = 0; l < m->c.layers; l++) CHECK_OK(to ? dm_layer_to_device(m->enc[l]) : dm_layer_to_host(m->enc[l]));
    for (int k = 0; k < 2; k++) CHECK_OK(to ? dm_layer_to_device(seg[k]) : dm_layer_to_host(seg[k]));
}

static void run_case(const char *cs, dm_schedule sched, dm_xent_mode xent) {
    dm_model_config c;
    memset(&c, 0, sizeof c);
    dm_layer_config_default(&c.layer);
    c.head = DM_MODEL_HEAD_MLM;
    const double p = strtod(meta_s(cs, "p"), NULL);
    c.layer.batch = meta(cs, "b"), c.layer.seq = meta(cs, "j"), c.layer.hidden = meta(cs, "i");
    c.layer.heads = meta(cs, "h"), c.layer.ffn = meta(cs, "u"), c.layer.dropout = p;
    c.layer.seed = strtoull(meta_s(cs, "seed"), NULL, 10), c.layer.eps = strtod(meta_s(cs, "eps"), NULL);
    CHECK_OK(dm_act_parse(meta_s(cs, "act"), &c.layer.act));
    CHECK_OK(dm_norm_parse(meta_s(cs, "norm"), &c.layer.norm));
    c.layers = (int)meta(cs, "l");
    c.sizes.vocab = meta(cs, "v"), c.sizes.positions = meta(cs, "n"), c.sizes.types = meta(cs, "t");
    c.sizes.predictions = meta(cs, "m");
    c.sizes.xent = xent;
    c.pad_id = meta(cs, "pad");
    dm_layer_options o = g_opt;
    o.schedule = sched;
    dm_model *m = NULL;
    CHECK_OK(dm_model_new(&m, &c, &o));
    if (!m) return;
    const char *wn = "";
    each_param(m, cs, 0, &wn);
    if (o.device != DM_DEVICE_CPU) segments_copy(m, 1);
    const int64_t n = c.layer.batch * c.layer.seq;
    char name[64];
    float *f[4];
    const char *in[4] = {"input_ids", "token_type_ids", "attention_mask", "labels"};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "%s.%s", cs, in[k]);
        f[k] = ref_f32(name, n);
    }
    int32_t *ids = malloc((size_t)n * 4), *types = malloc((size_t)n * 4), *labels = malloc((size_t)n * 4);
    if (f[0] && f[1] && f[2] && f[3] && ids && types && labels) {
        for (int64_t r = 0; r < n; r++) ids[r] = (int32_t)f[0][r], types[r] = (int32_t)f[1][r], labels[r] = (int32_t)f[3][r];
        CHECK_OK(dm_model_set_batch(m, ids, types, f[2], labels));
        CHECK(m->counted == meta(cs, "counted") && m->dropped == meta(cs, "dropped"));
        double loss = 0.0;
        int64_t correct = -1;
        CHECK_OK(dm_model_forward(m, 1, &loss, &correct));
        CHECK_OK(dm_model_backward(m));
        if (o.device != DM_DEVICE_CPU) segments_copy(m, 0);
        snprintf(name, sizeof name, "%s.expected.loss", cs);
        float *wl = ref_f32(name, 1);
        snprintf(name, sizeof name, "%s.expected.correct", cs);
        float *wc = ref_f32(name, 1);
        const double el = wl ? fabs(loss - wl[0]) / wl[0] : INFINITY;
        g_all[0] = g_all[1] = 0.0;
        const double eg = each_param(m, cs, 1, &wn), ea = g_all[1] > 0 ? sqrt(g_all[0] / g_all[1]) : INFINITY;
        printf("whole BertForMaskedLM step, case %s (%d layers, i=%lld, %s-LN, %s, dropout %g, %s%s, --fused-xent "
               "%s%s%s): loss %.6f within %.2e, %lld of %lld predicted; every gradient within %.2e (%s), all of them "
               "together %.2e\n", cs, c.layers, (long long)c.layer.hidden, meta_s(cs, "norm"), meta_s(cs, "act"), p,
               sched == DM_SCHED_FUSED ? "fused" : "unfused",
               o.unpad ? ", unpadded" : o.attention_op > 0 ? ", attention as one op" : "", dm_xent_mode_name(xent),
               o.device == DM_DEVICE_CPU ? "" : ", cuda ", o.device == DM_DEVICE_CPU ? "" : dm_dtype_name(o.dtype),
               loss, el, (long long)correct, (long long)c.sizes.predictions, eg, wn, ea);
        CHECK(m->c.sizes.xent == (xent == DM_XENT_AUTO ? DM_XENT_UNFUSED : xent));
        int fused_ops = 0;
        for (int q = 0; q < m->head->g.nop; q++) fused_ops += m->head->g.op[q].kind == DM_OP_LINEAR_XENT;
        CHECK(fused_ops == (xent == DM_XENT_FUSED));
        CHECK(el < g_tol_loss && eg < g_tol_grad && ea < g_tol_all);
        if (o.dtype != DM_DTYPE_BF16) CHECK(wc && correct == (int64_t)wc[0]); /* bf16 may flip a near tie */
        free(wl), free(wc);
    }
    for (int k = 0; k < 4; k++) free(f[k]);
    free(ids), free(types), free(labels);
    dm_model_free(m);
}

static void test_refusals(void) {
    dm_model_config c;
    memset(&c, 0, sizeof c);
    dm_layer_config_default(&c.layer);
    c.head = DM_MODEL_HEAD_MLM;
    c.layer.batch = 1, c.layer.seq = 4, c.layer.hidden = 8, c.layer.heads = 2, c.layer.ffn = 16;
    c.layers = 1;
    c.sizes = (dm_bert_sizes){.vocab = 10, .positions = 8, .types = 2, .predictions = 2};
    dm_model *m = NULL;
    CHECK_OK(dm_model_new(&m, &c, NULL));
    if (m) {
        int32_t good[4] = {4, 5, 6, 7}, ids[4] = {1, 2, 10, 3}, labels[4] = {-1, 5, -1, -1};
        CHECK_OK(dm_model_set_batch(m, good, NULL, NULL, labels));
        CHECK(dm_model_set_batch(m, ids, NULL, NULL, labels) == DM_ERR_INVALID_ARG &&
              strstr(dm_last_error(), "outside the vocabulary"));
        float *in;
        CHECK_OK(dm_layer_tensor(m->emb, "input_ids", &in, NULL, NULL));
        CHECK(in[0] == 4.0f && in[1] == 5.0f && m->counted == 1); /* the refused batch wrote nothing */
        ids[2] = 4, labels[1] = 12;
        CHECK(dm_model_set_batch(m, ids, NULL, NULL, labels) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "label"));
        float *p;
        CHECK(dm_model_tensor(m, "bert.encoder.layer.1.output.dense.weight", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
        CHECK_OK(dm_model_tensor(m, "bert.embeddings.word_embeddings.weight", &p, NULL, NULL));
    }
    dm_model_free(m);
    c.pad_id = 10;
    CHECK(dm_model_new(&m, &c, NULL) == DM_ERR_INVALID_ARG && m == NULL);
}

/* A model without a head, forward-only (no gradients held: an inference model), gives the
 * MLM model's last hidden states with the same parameters and no dropout; it has no
 * backward and no cls.* tensors. */
static void test_headless(void) {
    dm_model_config c;
    memset(&c, 0, sizeof c);
    dm_layer_config_default(&c.layer);
    c.head = DM_MODEL_HEAD_MLM;
    c.layer.batch = 2, c.layer.seq = 5, c.layer.hidden = 8, c.layer.heads = 2, c.layer.ffn = 16;
    c.layer.dropout = 0.0;
    c.layers = 2;
    c.sizes = (dm_bert_sizes){.vocab = 11, .positions = 8, .types = 2, .predictions = 2};
    dm_model *a = NULL, *b = NULL;
    const dm_layer_options fo = {.forward_only = 1};
    CHECK_OK(dm_model_new(&a, &c, NULL));
    c.head = DM_MODEL_HEAD_NONE;
    CHECK_OK(dm_model_new(&b, &c, &fo));
    if (a && b) {
        CHECK_OK(dm_model_init_params(a, 7));
        CHECK_OK(dm_model_init_params(b, 7));
        const int32_t ids[10] = {1, 5, 9, 3, 0, 2, 2, 7, 10, 4}, types[10] = {0, 0, 1, 1, 0, 0, 1, 1, 1, 0};
        const int32_t labels[10] = {-1, 3, -1, -1, -1, -1, 8, -1, -1, -1};
        const float mask[10] = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
        CHECK_OK(dm_model_set_batch(a, ids, types, mask, labels));
        CHECK_OK(dm_model_set_batch(b, ids, types, mask, NULL));
        double la = 0, lb = -1;
        CHECK_OK(dm_model_forward(a, 1, &la, NULL));
        CHECK_OK(dm_model_forward(b, 1, &lb, NULL));
        const float *ha = NULL, *hb = NULL;
        CHECK_OK(dm_model_hidden(a, &ha));
        CHECK_OK(dm_model_hidden(b, &hb));
        double worst = 0;
        for (int k = 0; ha && hb && k < 10 * 8; k++) {
            const double d = fabs((double)ha[k] - hb[k]) / (fabs((double)ha[k]) + 1e-3);
            worst = worst_of(worst, d);
        }
        printf("headless forward-only model: hidden states within %.2e of the MLM model's, loss %g\n", worst, lb);
        CHECK(ha && hb && worst < 1e-6 && lb == 0.0 && la > 0.0);
        CHECK(dm_model_backward(b) == DM_ERR_INVALID_ARG);
        float *p;
        CHECK(dm_model_tensor(b, "cls.predictions.bias", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
        CHECK(dm_model_tensor(b, "bert.encoder.layer.1.output.dense.weight.grad", &p, NULL, NULL) != DM_OK);
    }
    dm_model_free(a);
    dm_model_free(b);
}

/* A BERT trainer learns a pattern: each sequence is two runs of four equal tokens, the
 * second the first plus one (mod the vocabulary, [PAD] 0 and [MASK] V-1 left out); a sixth
 * of its tokens masked, new sequences each step: the loss falls by a tenth or more in 100
 * AdamW steps; then one batch 80 times is learnt by heart; the tensors are
 * there by Hugging Face name, with moments. */
static void test_trains(void) {
    enum { V = 24, Bt = 8, Jt = 8, STEPS = 100 };
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = Bt, cfg.seq = Jt, cfg.hidden = 32, cfg.heads = 2, cfg.ffn = 64, cfg.dropout = 0.0, cfg.seed = 3;
    dm_bert_model bm = {.vocab = V, .positions = 16, .types = 2, .pad_id = 0};
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 3e-3, a.clip_norm = 1.0, a.warmup = 10;
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &cfg, 2, &bm, NULL, &a));
    if (!T) return;
    CHECK(dm_trainer_is_bert(T) && dm_trainer_num_params(T) > 0);
    /* its segments (for profiling): the embeddings, the 2 layers, the head, nothing else */
    CHECK(dm_trainer_num_segments(T) == 4 && dm_trainer_num_segments(NULL) == 0);
    CHECK(dm_trainer_segment(T, -1) == NULL && dm_trainer_segment(T, 4) == NULL && dm_trainer_segment(NULL, 0) == NULL);
    CHECK(dm_layer_tensor_id(dm_trainer_segment(T, 0), "embeddings.word_embeddings.weight") >= 0 &&
          dm_layer_tensor_id(dm_trainer_segment(T, 3), "cls.predictions.bias") >= 0 &&
          dm_trainer_segment(T, 1) != dm_trainer_segment(T, 2));
    CHECK_OK(dm_trainer_init_params(T, 1));
    int32_t ids[Bt * Jt], labels[Bt * Jt];
    double first = 0, last = 0;
    dm_mlm_stats st = {0};
    int64_t hits_late = 0, scored_late = 0;
    for (int s = 1; s <= STEPS; s++) {
        uint32_t w[Bt * Jt + Bt];
        dm_philox_words(77, 9, (uint64_t)s * (Bt * Jt + Bt), Bt * Jt + Bt, w);
        for (int b = 0; b < Bt; b++)
            for (int j = 0; j < Jt; j++) {
                const int r = b * Jt + j, tok = 1 + (int)((w[Bt * Jt + b] + (uint32_t)(j / 4)) % (V - 2));
                const int masked = w[r] % 6 == 0;
                ids[r] = masked ? V - 1 : tok;
                labels[r] = masked ? tok : -1;
            }
        CHECK_OK(dm_trainer_set_mlm_batch(T, ids, NULL, NULL, labels));
        double loss = 0;
        CHECK_OK(dm_trainer_step(T, &loss));
        CHECK_OK(dm_trainer_mlm_stats(T, &st));
        if (s <= 3) first += loss / 3;
        if (s > STEPS - 3) last += loss / 3, hits_late += st.correct, scored_late += st.scored;
    }
    printf("BERT trainer (2 layers, i=32, vocabulary %d) on runs of equal tokens, %d AdamW steps: loss %.3f -> %.3f, "
           "last steps' accuracy %lld/%lld, gradient norm %.3g\n", V, STEPS, first, last, (long long)hits_late,
           (long long)scored_late, dm_trainer_grad_norm(T));
    CHECK(last < 0.9 * first); /* PyTorch's BertForMaskedLM on this task: 3.25 -> 2.07 in 100 steps */
    /* one batch again and again: learnt by heart */
    double again = 0;
    for (int s = 1; s <= 80; s++) CHECK_OK(dm_trainer_step(T, &again));
    CHECK_OK(dm_trainer_mlm_stats(T, &st));
    printf("  the last batch 80 more times: loss %.3f, %lld/%lld predicted\n", again, (long long)st.correct,
           (long long)st.scored);
    CHECK(again < 0.5 && st.correct == st.scored && st.scored > 0);
    /* evaluation: no dropout (this model has none: the same loss as training's forward),
     * the same twice, the state unchanged */
    double e1 = 0, e2 = 0, f1 = 0;
    CHECK_OK(dm_trainer_evaluate(T, &e1));
    CHECK_OK(dm_trainer_evaluate(T, &e2));
    CHECK_OK(dm_trainer_forward(T, &f1));
    CHECK(e1 == e2 && e1 == f1 && dm_trainer_step_count(T) == STEPS + 80);
    /* the hits need not be counted: the same loss, correct -1 */
    double f2 = 0;
    CHECK_OK(dm_trainer_set_count_correct(T, 0));
    CHECK_OK(dm_trainer_forward(T, &f2));
    CHECK_OK(dm_trainer_mlm_stats(T, &st));
    CHECK(f2 == f1 && st.correct == -1 && st.scored > 0);
    CHECK_OK(dm_trainer_set_count_correct(T, 1));
    CHECK_OK(dm_trainer_forward(T, &f2));
    CHECK_OK(dm_trainer_mlm_stats(T, &st));
    CHECK(st.correct == st.scored);
    /* a batch with no masked position: no gradient, and no update (AdamW's momentum and
     * weight decay alone would move the weights); the step is counted */
    {
        for (int r = 0; r < Bt * Jt; r++) labels[r] = -1;
        float *w0 = NULL, *m0 = NULL;
        CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight", &w0, NULL, NULL));
        CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight.exp_avg", &m0, NULL, NULL));
        const float w_before = w0 ? w0[5] : 0.0f, m_before = m0 ? m0[5] : 0.0f;
        const int64_t steps = dm_trainer_step_count(T), skipped = dm_trainer_skipped(T);
        CHECK_OK(dm_trainer_set_mlm_batch(T, ids, NULL, NULL, labels));
        double none = -1;
        CHECK_OK(dm_trainer_step(T, &none));
        CHECK_OK(dm_trainer_mlm_stats(T, &st));
        CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight", &w0, NULL, NULL));
        CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.0.attention.self.query.weight.exp_avg", &m0, NULL, NULL));
        CHECK(none == 0.0 && st.scored == 0 && dm_trainer_skipped(T) == skipped + 1 &&
              dm_trainer_step_count(T) == steps + 1 && w0 && w0[5] == w_before && m0 && m0[5] == m_before &&
              m_before != 0.0f);
        printf("  a batch with no masked position: step counted, no update (skipped %lld)\n",
               (long long)dm_trainer_skipped(T));
        /* the count is the optimizer's state (its bias correction): a checkpoint keeps it */
        char path[] = "/tmp/dmove_skip_XXXXXX";
        const int fd = mkstemp(path);
        CHECK(fd >= 0);
        if (fd >= 0) close(fd);
        CHECK_OK(dm_trainer_save(T, path));
        dm_trainer *R = NULL;
        CHECK_OK(dm_trainer_new_bert(&R, &cfg, 2, &bm, NULL, &a));
        if (R) CHECK_OK(dm_trainer_load(R, path));
        CHECK(R && dm_trainer_skipped(R) == dm_trainer_skipped(T) && dm_trainer_step_count(R) == dm_trainer_step_count(T));
        dm_trainer_free(R);
        unlink(path);
    }
    float *p;
    int nd;
    int64_t sh[4];
    CHECK_OK(dm_trainer_tensor(T, "bert.embeddings.word_embeddings.weight.exp_avg", &p, &nd, sh));
    CHECK(nd == 2 && sh[0] == V && sh[1] == 32);
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.transform.dense.weight", &p, &nd, sh));
    float *q;
    CHECK_OK(dm_trainer_tensor(T, "bert.embeddings.word_embeddings.weight.exp_avg", &p, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.decoder.weight.exp_avg", &q, NULL, NULL));
    CHECK(p == q); /* the tied decoder is the word table */
    CHECK_OK(dm_trainer_tensor(T, "cls.predictions.decoder.weight", &q, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(T, "bert.embeddings.word_embeddings.weight", &p, NULL, NULL));
    CHECK(p == q);
    CHECK(dm_trainer_step_count(T) == STEPS + 80 + 1); /* the one without a masked position too */
    dm_trainer_free(T);
}

/* The BERT trainer on the CUDA backend (emulated without a GPU) against the CPU's: the
 * same 4 AdamW steps (dropout 0.1, clipping) from the same parameters and batches, fp32
 * (losses within 1e-6, parameters and moments within 1e-5: only summation orders differ)
 * and bf16 storage (losses within 1e-2, the moments within 3e-2, as tests/test_train.c's
 * stack); a checkpoint of step 2 resumed on the CUDA backend gives the same steps 3 and 4
 * bit for bit (the embeddings' scatter-add is deterministic). */
static void cuda_trainer_batch(dm_trainer *T, int s, int V, int B, int J) {
    int32_t ids[64], labels[64];
    uint32_t w[64];
    dm_philox_words(41, 7, (uint64_t)s * 64, 64, w);
    for (int r = 0; r < B * J; r++) {
        ids[r] = 1 + (int)(w[r] % (uint32_t)(V - 2));
        labels[r] = w[r] % 5 == 0 ? ids[r] : -100;
        if (w[r] % 5 == 0 && w[r] % 2) ids[r] = V - 1; /* [MASK] */
    }
    CHECK_OK(dm_trainer_set_mlm_batch(T, ids, NULL, NULL, labels));
}

static void test_cuda_trainer(void) {
    enum { V = 24, Bt = 4, Jt = 8, STEPS = 4 };
    const dm_backend *cb = NULL;
    if (dm_backend_find(DM_DEVICE_CUDA, &cb) != DM_OK) {
        printf("SKIP: the BERT trainer on the CUDA backend: %s\n", dm_last_error());
        return;
    }
    const char *was = getenv("DMOVE_CUDA_EMULATE");
    if (!was) setenv("DMOVE_CUDA_EMULATE", "1", 1);
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = Bt, cfg.seq = Jt, cfg.hidden = 32, cfg.heads = 2, cfg.ffn = 64, cfg.dropout = 0.1, cfg.seed = 3;
    dm_bert_model bm = {.vocab = V, .positions = 16, .types = 2, .pad_id = 0};
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 1e-3, a.warmup = 1, a.clip_norm = 1.0;
    static const char *const names[] = {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                                        "bert.embeddings.token_type_embeddings.weight",
                                        "bert.encoder.layer.1.attention.output.dense.weight",
                                        "cls.predictions.transform.dense.weight", "cls.predictions.bias"};
    static const char *const kinds[3] = {"", ".exp_avg", ".exp_avg_sq"};
    char path[] = "/tmp/dmove_test_bertgpu.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    for (int v = 0; v < 2; v++) {
        dm_layer_options go = {.device = DM_DEVICE_CUDA, .dtype = v ? DM_DTYPE_BF16 : DM_DTYPE_FP32};
        dm_trainer *C = NULL, *G = NULL, *R = NULL;
        CHECK_OK(dm_trainer_new_bert(&C, &cfg, 2, &bm, NULL, &a));
        CHECK_OK(dm_trainer_new_bert(&G, &cfg, 2, &bm, &go, &a));
        CHECK_OK(dm_trainer_new_bert(&R, &cfg, 2, &bm, &go, &a));
        if (!C || !G || !R) goto next;
        CHECK_OK(dm_trainer_init_params(C, 5));
        CHECK_OK(dm_trainer_init_params(G, 5));
        CHECK_OK(dm_trainer_init_params(R, 9));
        double lc[STEPS], lg[STEPS], lr[STEPS], worst_loss = 0, worst = 0;
        const char *wn = "";
        for (int s = 0; s < STEPS; s++) {
            cuda_trainer_batch(C, s, V, Bt, Jt);
            CHECK_OK(dm_trainer_step(C, &lc[s]));
            cuda_trainer_batch(G, s, V, Bt, Jt);
            CHECK_OK(dm_trainer_step(G, &lg[s]));
            if (s == 1) CHECK_OK(dm_trainer_save(G, path));
            const double e = fabs(lg[s] - lc[s]) / lc[s];
            worst_loss = worst_of(worst_loss, e);
        }
        for (size_t q = 0; q < sizeof names / sizeof names[0]; q++)
            for (int k = v; k < 3; k++) { /* bf16: the moments (see tests/test_train.c) */
                char nm[160];
                snprintf(nm, sizeof nm, "%s%s", names[q], kinds[k]);
                float *pc = NULL, *pg = NULL;
                int nd = 0;
                int64_t sh[4] = {0, 0, 0, 0};
                CHECK_OK(dm_trainer_tensor(C, nm, &pc, &nd, sh));
                CHECK_OK(dm_trainer_tensor(G, nm, &pg, NULL, NULL));
                if (!pc || !pg) continue;
                const double e = rel_err(pg, pc, (size_t)(nd == 1 ? sh[0] : sh[0] * sh[1]));
                if (!(e <= worst)) worst = worst_of(worst, e), wn = names[q];
            }
        /* resumed at step 2 on the CUDA backend: steps 3 and 4 bit-identical */
        CHECK_OK(dm_trainer_load(R, path));
        for (int s = 2; s < STEPS; s++) {
            cuda_trainer_batch(R, s, V, Bt, Jt);
            CHECK_OK(dm_trainer_step(R, &lr[s]));
        }
        float *pg = NULL, *pr = NULL;
        int64_t sh[4] = {0, 0, 0, 0};
        CHECK_OK(dm_trainer_tensor(G, names[0], &pg, NULL, sh));
        CHECK_OK(dm_trainer_tensor(R, names[0], &pr, NULL, NULL));
        const int same = pg && pr && lr[2] == lg[2] && lr[3] == lg[3] &&
                         !memcmp(pg, pr, sizeof(float) * (size_t)(sh[0] * sh[1]));
        printf("BERT trainer (2 layers, i=32, dropout 0.1), %d AdamW steps on the CUDA backend (%s) %s vs the CPU: "
               "losses within %.2e, %s within %.2e (%s); resumed from step 2: %s\n", STEPS, cuda_where(), v ? "bf16" : "fp32",
               worst_loss, v ? "moments" : "parameters and moments", worst, wn, same ? "bit-identical" : "DIFFERENT");
        CHECK(worst_loss < (v ? 1e-2 : 1e-6) && worst < (v ? 3e-2 : 1e-5) && same);
    next:
        dm_trainer_free(C);
        dm_trainer_free(G);
        dm_trainer_free(R);
    }
    unlink(path);
    if (!was) unsetenv("DMOVE_CUDA_EMULATE");
}

/* Step s's batch of the resume test: from s alone. */
static void resume_batch(dm_trainer *T, int s, int B, int J, int V) {
    int32_t ids[64], labels[64], types[64];
    uint32_t w[64];
    dm_philox_words(5, 3, (uint64_t)s * 64, 64, w);
    for (int r = 0; r < B * J; r++) {
        ids[r] = 1 + (int)(w[r] % (uint32_t)(V - 2));
        labels[r] = w[r] % 5 == 0 ? ids[r] : -100;
        types[r] = r % J >= J / 2;
        if (labels[r] >= 0) ids[r] = V - 1;
    }
    CHECK_OK(dm_trainer_set_mlm_batch(T, ids, types, NULL, labels));
}

/* A checkpoint of a BERT trainer (dropout, LAMB, 2 micro-batches) at update 2, resumed by
 * a new trainer: updates 3 and 4 give the very same state as the run that went on; the
 * file holds BertForMaskedLM's names; another vocabulary is refused. */
static void test_resume(void) {
    enum { V = 20, B = 2, J = 8 };
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = B, cfg.seq = J, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32, cfg.dropout = 0.1, cfg.seed = 9;
    dm_bert_model bm = {.vocab = V, .positions = 8, .types = 2, .pad_id = 0};
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.kind = DM_OPT_LAMB, a.lr = 1e-3, a.accumulate = 2, a.clip_norm = 1.0;
    dm_trainer *A = NULL, *R = NULL, *W = NULL;
    char path[] = "/tmp/dmove_test_bert_ckpt.XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_OK(dm_trainer_new_bert(&A, &cfg, 2, &bm, NULL, &a));
    CHECK_OK(dm_trainer_new_bert(&R, &cfg, 2, &bm, NULL, &a));
    if (!A || !R || fd < 0) goto out;
    CHECK_OK(dm_trainer_init_params(A, 4));
    CHECK_OK(dm_trainer_init_params(R, 8));
    for (int s = 1; s <= 8; s++) {
        resume_batch(A, s, B, J, V);
        CHECK_OK(dm_trainer_step(A, NULL));
        if (s == 4) CHECK_OK(dm_trainer_save(A, path));
    }
    CHECK_OK(dm_trainer_load(R, path));
    CHECK(dm_trainer_step_count(R) == 2);
    for (int s = 5; s <= 8; s++) {
        resume_batch(R, s, B, J, V);
        CHECK_OK(dm_trainer_step(R, NULL));
    }
    int same = 1;
    for (int k = 0; k < A->nslots && same; k++) {
        char name[192];
        float *pa, *pr;
        int nd;
        int64_t sh[4];
        static const char *const suf[3] = {"", ".exp_avg", ".exp_avg_sq"};
        for (int w = 0; w < 3 && same; w++) {
            const char *rest = A->slot[k].pname;
            const int seg = A->slot[k].seg;
            if (seg == 0) snprintf(name, sizeof name, "bert.%s%s", rest, suf[w]);
            else if (seg <= 2) snprintf(name, sizeof name, "bert.encoder.layer.%d.%s%s", seg - 1, rest, suf[w]);
            else snprintf(name, sizeof name, "%s%s", rest, suf[w]);
            if (dm_trainer_tensor(A, name, &pa, &nd, sh) != DM_OK || dm_trainer_tensor(R, name, &pr, NULL, NULL) != DM_OK) {
                same = 0;
                break;
            }
            const int64_t n = nd == 1 ? sh[0] : sh[0] * sh[1];
            same = !memcmp(pa, pr, (size_t)n * sizeof(float));
        }
    }
    printf("BERT trainer (LAMB, 2 micro-batches, dropout 0.1): checkpoint at update 2, resumed: %s\n",
           same ? "bit-identical" : "DIFFERENT");
    CHECK(same);
    dm_tensor_file *f = NULL;
    CHECK_OK(dm_tensor_file_open(&f, path));
    CHECK(dm_tensor_file_find(f, "bert.embeddings.word_embeddings.weight") >= 0 &&
          dm_tensor_file_find(f, "bert.encoder.layer.1.output.dense.weight.exp_avg") >= 0 &&
          dm_tensor_file_find(f, "cls.predictions.transform.dense.weight") >= 0);
    dm_tensor_file_free(f);
    /* exported as transformers saves a BertForMaskedLM: the parameters alone, its names, the
     * tied decoder left out; the config says the sizes */
    {
        char dir[] = "/tmp/dmove_test_export.XXXXXX";
        CHECK(mkdtemp(dir) != NULL);
        CHECK_OK(dm_trainer_export(R, dir));
        char mp[96], cp[96];
        snprintf(mp, sizeof mp, "%s/model.safetensors", dir);
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        dm_tensor_file *e = NULL;
        CHECK_OK(dm_tensor_file_open(&e, mp));
        float *word;
        int64_t sh[4];
        CHECK_OK(dm_trainer_tensor(R, "bert.embeddings.word_embeddings.weight", &word, NULL, sh));
        const int wi = e ? dm_tensor_file_find(e, "bert.embeddings.word_embeddings.weight") : -1;
        float *back = malloc((size_t)(V * 16) * sizeof(float));
        CHECK(wi >= 0 && back && dm_tensor_file_read_f32(e, wi, back, (size_t)(V * 16)) == DM_OK &&
              !memcmp(back, word, (size_t)(V * 16) * sizeof(float)));
        free(back);
        CHECK(e && dm_tensor_file_count(e) == R->nslots && dm_tensor_file_find(e, "cls.predictions.bias") >= 0 &&
              dm_tensor_file_find(e, "bert.encoder.layer.1.attention.self.query.weight") >= 0 &&
              dm_tensor_file_find(e, "cls.predictions.decoder.weight") < 0 &&
              dm_tensor_file_find(e, "bert.embeddings.word_embeddings.weight.exp_avg") < 0);
        dm_tensor_file_free(e);
        dm_hf_config hc;
        CHECK_OK(dm_hf_config_read(cp, &hc));
        CHECK(hc.vocab_size == V && hc.hidden_size == 16 && hc.num_hidden_layers == 2 && hc.num_attention_heads == 2 &&
              hc.intermediate_size == 32 && hc.max_position_embeddings == 8 && hc.type_vocab_size == 2 &&
              hc.pad_token_id == 0 && hc.hidden_dropout_prob == 0.1 && !strcmp(hc.architecture, "BertForMaskedLM"));
        unlink(mp), unlink(cp), rmdir(dir);
    }
    bm.vocab = V + 1;
    CHECK_OK(dm_trainer_new_bert(&W, &cfg, 2, &bm, NULL, &a));
    if (W) CHECK(dm_trainer_load(W, path) == DM_ERR_SHAPE && strstr(dm_last_error(), "vocab="));
out:
    unlink(path);
    dm_trainer_free(A);
    dm_trainer_free(R);
    dm_trainer_free(W);
}

/* Evaluation mode: with dropout 0.3, the same loss twice, and another than training's. */
static void test_eval_mode(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32, cfg.dropout = 0.3, cfg.seed = 5;
    dm_bert_model bm = {.vocab = 20, .positions = 8, .types = 2, .pad_id = 0};
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &cfg, 1, &bm, NULL, NULL));
    if (!T) return;
    CHECK_OK(dm_trainer_init_params(T, 2));
    int32_t ids[16], labels[16];
    for (int r = 0; r < 16; r++) ids[r] = 1 + r % 18, labels[r] = r % 3 == 0 ? 5 : -100;
    CHECK_OK(dm_trainer_set_mlm_batch(T, ids, NULL, NULL, labels));
    double e1 = 0, e2 = 0, t1 = 0, t2 = 0;
    CHECK_OK(dm_trainer_evaluate(T, &e1));
    CHECK_OK(dm_trainer_forward(T, &t1));
    CHECK_OK(dm_trainer_evaluate(T, &e2));
    CHECK_OK(dm_trainer_forward(T, &t2));
    printf("dropout 0.3: evaluation loss %.6f (twice %.6f), training-mode loss %.6f (twice %.6f)\n", e1, e2, t1, t2);
    CHECK(e1 == e2 && t1 == t2 && e1 != t1);
    dm_trainer_free(T);
}

int main(void) {
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(REF_DIR "/model_step.safetensors", &f));
    if (!f) TEST_END();
    g_ref = f;
    /* the cases the reference lists ("A,B,C,D,E"), each under both schedules, the MLM
     * head's decoder and cross-entropy fused (LINEAR_XENT) or not (and auto, unfused:
     * once); then each on its real tokens alone (unpadded layers) and with the padded
     * layers' attention as one op, fused, the decoder and cross-entropy fused and not */
    const char *cases = dm_st_metadata(f, "cases");
    CHECK(cases != NULL && strlen(cases) >= 9);
    for (int mode = 0; mode < 3; mode++) {
        g_opt = (dm_layer_options){.unpad = mode == 1, .attention_op = mode == 2};
        for (const char *c = cases ? cases : ""; *c; c++) {
            if (*c == ',') continue;
            const char cs[2] = {*c, 0};
            for (int x = 0; x < 3; x++)
                for (int s = 0; s < 2; s++)
                    if ((x != DM_XENT_AUTO || !s) && (!mode || (!s && x != DM_XENT_AUTO)))
                        run_case(cs, s ? DM_SCHED_UNFUSED : DM_SCHED_FUSED, (dm_xent_mode)x);
        }
    }
    g_opt = (dm_layer_options){0};
    /* the CUDA backend (emulated without a GPU): the same steps in fp32, then in bf16
     * storage against the same (fp32) references at a bf16 tolerance; the MLM head's
     * decoder and cross-entropy apart and fused */
    const dm_backend *cb = NULL;
    if (dm_backend_find(DM_DEVICE_CUDA, &cb) == DM_OK) {
        const char *was = getenv("DMOVE_CUDA_EMULATE");
        if (!was) setenv("DMOVE_CUDA_EMULATE", "1", 1);
        for (int v = 0; v < 2; v++) {
            g_opt = (dm_layer_options){.device = DM_DEVICE_CUDA, .dtype = v ? DM_DTYPE_BF16 : DM_DTYPE_FP32};
            /* bf16 (unit roundoff u = 3.9e-3) storage of the parameters, every activation
             * and every gradient, against fp32 references: the loss within 1e-2; every
             * gradient together within 4e-2 (seen: 1.7e-2 to 2.3e-2 emulated, the encoder
             * layers' gradients 2e-2 to 3e-2 each: the rounding of two layers' backward),
             * each tensor within 1e-1 (seen 5.1e-2: a LayerNorm weight's gradient, a sum over
             * all rows with cancellation; the query bias's against its weight's scale, as
             * each_param says), the key bias's (zero but for rounding) under 3e-2 of the
             * query bias's largest (seen 1.3e-2) */
            if (v) g_tol_loss = 1e-2, g_tol_grad = 1e-1, g_tol_all = 4e-2, g_tol_zero = 3e-2, g_zero_vs_query = 1;
            for (const char *c = cases ? cases : ""; *c; c++) {
                if (*c == ',') continue;
                const char cs[2] = {*c, 0};
                for (int s = 0; s < 2; s++) run_case(cs, s ? DM_SCHED_UNFUSED : DM_SCHED_FUSED, DM_XENT_UNFUSED);
                run_case(cs, DM_SCHED_FUSED, DM_XENT_FUSED); /* the decoder and cross-entropy fused: xent.cu */
            }
        }
        g_opt = (dm_layer_options){0};
        g_tol_loss = 1e-5, g_tol_grad = 1e-4, g_tol_all = 1e-4, g_tol_zero = 1e-6, g_zero_vs_query = 0;
        if (!was) unsetenv("DMOVE_CUDA_EMULATE");
    } else {
        printf("SKIP: the CUDA backend: %s\n", dm_last_error());
    }
    test_cuda_trainer();
    test_refusals();
    test_headless();
    test_trains();
    test_eval_mode();
    test_resume();
    dm_st_free(f);
    TEST_END();
}
