/* test_train.c: the trainer (a stack of layers, its loss, AdamW, checkpoints):
 *  - AdamW against torch.optim.AdamW (tests/ref/train_stack.safetensors) and against a
 *    naive double-precision reference over several steps; the learning rate schedule;
 *  - one step of a two-layer stack (padding, dropout with each layer's own masks) against
 *    PyTorch: output, loss and every parameter's gradient;
 *  - (checkpoints and parameter files on the CPU: test_checkpoint.c)
 *  - the stack learns a teacher's function (the loss falls); a non-finite loss stops a
 *    step before the update; the loss chart is well-formed SVG with a point per step. */
#include <expat.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/philox.h"
#include "core/safetensors.h"
#include "dmove.h"
#include "dmove_tools.h"
#include "graph/encoder.h"
#include "testutil.h"
#include "train/train.h"
#include "train/trainer_internal.h"
#include "trainutil.h"

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

static float *copy_of(const dm_st_file *f, const char *name, size_t *n) {
    const dm_st_tensor *t = dm_st_find(f, name);
    if (!t) {
        fprintf(stderr, "reference tensor %s missing\n", name);
        return NULL;
    }
    size_t k = t->nbytes / 4;
    float *p = malloc(k * sizeof(float));
    if (p && dm_st_to_f32(t, p, k) != DM_OK) {
        free(p);
        return NULL;
    }
    if (n) *n = k;
    return p;
}


/* --- AdamW ------------------------------------------------------------------------------ */

static void test_adamw_torch(const dm_st_file *f) {
    dm_optim_config c;
    dm_optim_config_default(&c);
    c.lr = 1e-3, c.beta1 = 0.9, c.beta2 = 0.999, c.eps = 1e-6, c.weight_decay = 0.01;
    const char *tags[2] = {"decay", "nodecay"};
    for (int k = 0; k < 2; k++) {
        char nm[7][64];
        const char *parts[7] = {"p0", "g", "m0", "v0", "p1", "m1", "v1"};
        float *a[7];
        size_t n = 0;
        for (int q = 0; q < 7; q++) {
            snprintf(nm[q], sizeof nm[q], "adamw.%s.%s", tags[k], parts[q]);
            a[q] = copy_of(f, nm[q], &n);
        }
        CHECK(a[0] && a[1] && a[2] && a[3] && a[4] && a[5] && a[6]);
        if (a[0] && a[1] && a[2] && a[3] && a[4] && a[5] && a[6]) {
            dm_adamw_update(a[0], a[1], a[2], a[3], (int64_t)n, c.lr, k == 0 ? c.weight_decay : 0.0, &c, 3);
            double ep = rel_err(a[0], a[4], n), em = rel_err(a[2], a[5], n), ev = rel_err(a[3], a[6], n);
            printf("AdamW vs torch.optim.AdamW (%s, step 3): rel.err p %.2e  exp_avg %.2e  exp_avg_sq %.2e\n", tags[k],
                   ep, em, ev);
            CHECK(ep < 3e-7); /* measured <= 3e-8 */
            CHECK(em < 3e-7); /* measured <= 3e-8 */
            CHECK(ev < 3e-7); /* measured <= 3e-8 */
        }
        for (int q = 0; q < 7; q++) free(a[q]);
    }
}

/* torch.optim.AdamW's definition in double, step by step. */
static void adamw_naive(double *p, const double *g, double *m, double *v, int64_t n, double lr, double wd,
                        const dm_optim_config *c, int64_t t) {
    for (int64_t k = 0; k < n; k++) {
        p[k] *= 1.0 - lr * wd;
        m[k] = c->beta1 * m[k] + (1.0 - c->beta1) * g[k];
        v[k] = c->beta2 * v[k] + (1.0 - c->beta2) * g[k] * g[k];
        const double mh = m[k] / (1.0 - pow(c->beta1, (double)t)), vh = v[k] / (1.0 - pow(c->beta2, (double)t));
        p[k] -= lr * mh / (sqrt(vh) + c->eps);
    }
}

static void test_adamw_naive(void) {
    enum { N = 4099 }; /* not a multiple of any vector width */
    dm_optim_config c;
    dm_optim_config_default(&c);
    c.lr = 3e-3;
    c.weight_decay = 0.1;
    float *p = malloc(N * 4), *g = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4), *pf = malloc(N * 4);
    double *pd = malloc(N * 8), *gd = malloc(N * 8), *md = calloc(N, 8), *vd = calloc(N, 8);
    CHECK(p && g && m && v && pf && pd && gd && md && vd);
    if (!(p && g && m && v && pf && pd && gd && md && vd)) goto out;
    uint32_t w[2 * N];
    dm_philox_words(99, 1, 0, 2 * N, w);
    for (int k = 0; k < N; k++) {
        p[k] = (float)((double)w[k] / 4294967296.0 - 0.5);
        pd[k] = p[k];
    }
    double worst = 0;
    for (int64_t t = 1; t <= 5; t++) {
        dm_philox_words(99, 2, (uint64_t)t * 2 * N, 2 * N, w);
        for (int k = 0; k < N; k++) {
            /* gradients over six decades, both signs */
            g[k] = (float)(((double)w[k] / 4294967296.0 - 0.5) * pow(10.0, -6.0 * (double)w[N + k] / 4294967296.0));
            gd[k] = g[k];
        }
        dm_adamw_update(p, g, m, v, N, c.lr, c.weight_decay, &c, t);
        adamw_naive(pd, gd, md, vd, N, c.lr, c.weight_decay, &c, t);
        for (int k = 0; k < N; k++) pf[k] = (float)pd[k];
        double e = rel_err(p, pf, N);
        worst = worst_of(worst, e);
    }
    printf("AdamW vs naive double reference, 5 steps: worst rel.err %.2e\n", worst);
    CHECK(worst < 1e-6);
out:
    free(p), free(g), free(m), free(v), free(pf), free(pd), free(gd), free(md), free(vd);
}

static void test_schedule(void) {
    dm_optim_config c;
    dm_optim_config_default(&c);
    c.lr = 1.0;
    CHECK(dm_optim_lr(&c, 1) == 1.0 && dm_optim_lr(&c, 1000) == 1.0);
    c.warmup = 4;
    c.total = 10;
    CHECK_OK(dm_optim_config_check(&c));
    CHECK(fabs(dm_optim_lr(&c, 1) - 0.25) < 1e-15 && fabs(dm_optim_lr(&c, 4) - 1.0) < 1e-15);
    CHECK(fabs(dm_optim_lr(&c, 5) - 1.0) < 1e-15);      /* the first step after warm-up: the peak */
    CHECK(fabs(dm_optim_lr(&c, 10) - 1.0 / 6) < 1e-15); /* the last step still learns */
    CHECK(dm_optim_lr(&c, 11) == 0.0);
    dm_optim_config bad = c;
    bad.warmup = 10;
    CHECK(dm_optim_config_check(&bad) == DM_ERR_INVALID_ARG);
    bad = c, bad.lr = 0;
    CHECK(dm_optim_config_check(&bad) == DM_ERR_INVALID_ARG);
    bad = c, bad.beta2 = 1.0;
    CHECK(dm_optim_config_check(&bad) == DM_ERR_INVALID_ARG);
    bad = c, bad.eps = NAN;
    CHECK(dm_optim_config_check(&bad) == DM_ERR_INVALID_ARG);
    CHECK(dm_train_layer_seed(7, 0, 1) != dm_train_layer_seed(7, 1, 1));
    CHECK(dm_train_layer_seed(7, 0, 1) != dm_train_layer_seed(7, 0, 2));
}

/* --- the stack against PyTorch --------------------------------------------------------- */

static int put(dm_trainer *T, const dm_st_file *f, const char *name) {
    float *p;
    int64_t sh[4];
    int nd;
    if (dm_trainer_tensor(T, name, &p, &nd, sh) != DM_OK) return -1;
    size_t n = 1;
    for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
    const dm_st_tensor *t = dm_st_find(f, name);
    return t && dm_st_to_f32(t, p, n) == DM_OK ? 0 : -1;
}

/* device: the CPU, or the CUDA backend (emulated without a GPU: DMOVE_CUDA_EMULATE) in fp32 */
static void test_stack_torch(const dm_st_file *f, const char *path, dm_device_kind device) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 5, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 12;
    cfg.dropout = 0.1, cfg.seed = 7, cfg.eps = 1e-12, cfg.act = DM_ACT_GELU;
    for (int sched = 0; sched < 2; sched++) {
        dm_layer_options o = {.schedule = sched ? DM_SCHED_UNFUSED : DM_SCHED_FUSED, .device = device};
        dm_trainer *T = NULL;
        CHECK_OK(dm_trainer_new(&T, &cfg, 2, &o, NULL));
        if (!T) return;
        CHECK_OK(dm_trainer_load_params(T, path)); /* the references' parameters, by HF names */
        CHECK(put(T, f, "hidden_states") == 0 && put(T, f, "attention_mask") == 0 && put(T, f, "target") == 0);
        double loss = 0;
        CHECK_OK(dm_trainer_forward(T, &loss));
        float *y, *want = copy_of(f, "expected.output", NULL), *wl = copy_of(f, "expected.loss", NULL);
        CHECK_OK(dm_trainer_tensor(T, "output", &y, NULL, NULL));
        double eo = want ? rel_err(y, want, 2 * 5 * 8) : 1, el = wl ? fabs(loss - wl[0]) / fabs(wl[0]) : 1;
        double worst = 0;
        const char *worst_name = "";
        CHECK_OK(dm_trainer_step(T, &loss));
        CHECK(dm_trainer_step_count(T) == 1);
        double el2 = wl ? fabs(loss - wl[0]) / fabs(wl[0]) : 1;
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < DM_NUM_PARAMS; k++) {
                char name[128], ref[160];
                snprintf(name, sizeof name, "encoder.layer.%d.%s.grad", l, dm_param_names[k]);
                snprintf(ref, sizeof ref, "expected.%s", name);
                float *g, *r;
                int nd;
                int64_t sh[4];
                size_t n;
                CHECK_OK(dm_trainer_tensor(T, name, &g, &nd, sh));
                r = copy_of(f, ref, &n);
                CHECK(r != NULL);
                if (!r) continue;
                double e = rel_err(g, r, n);
                if (!(e <= worst)) worst = worst_of(worst, e), worst_name = dm_param_names[k];
                CHECK(e < 1e-4);
                free(r);
            }
        printf("2-layer stack vs PyTorch (%s%s, dropout 0.1, padding): output %.2e, loss %.2e (after the step's "
               "forward %.2e), worst gradient %.2e (%s)\n",
               sched ? "unfused" : "fused", device == DM_DEVICE_CUDA ? ", the CUDA backend" : "", eo, el, el2, worst,
               worst_name);
        CHECK(eo < 1e-5);
        CHECK(el < 1e-5);
        CHECK(el2 < 1e-5);
        free(want);
        free(wl);
        dm_trainer_free(T);
    }
}

/* A layer without the input gradient (the first of a stack): the same parameter gradients,
 * no grad_hidden_states, and exactly the input-gradient GEMM's flop less in backward. */
static void test_no_input_grad(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 12, cfg.hidden = 32, cfg.heads = 4, cfg.ffn = 64, cfg.dropout = 0.1, cfg.seed = 5;
    for (int sched = 0; sched < 2; sched++) {
        dm_layer_options a = {.schedule = sched ? DM_SCHED_UNFUSED : DM_SCHED_FUSED}, b = a;
        b.no_input_grad = 1;
        dm_layer *A = NULL, *B = NULL;
        CHECK_OK(dm_layer_new(&A, &cfg, &a));
        CHECK_OK(dm_layer_new(&B, &cfg, &b));
        if (!A || !B) {
            dm_layer_free(A);
            dm_layer_free(B);
            return;
        }
        CHECK_OK(dm_layer_init_params(A, 4));
        CHECK_OK(dm_layer_init_params(B, 4));
        float *xa, *xb, *p;
        CHECK_OK(dm_layer_tensor(A, "hidden_states", &xa, NULL, NULL));
        CHECK_OK(dm_layer_tensor(B, "hidden_states", &xb, NULL, NULL));
        uint32_t w[2 * 12 * 32];
        dm_philox_words(3, 1, 0, 2 * 12 * 32, w);
        for (int e = 0; e < 2 * 12 * 32; e++) xa[e] = xb[e] = (float)((double)w[e] / 4294967296.0 - 0.5);
        CHECK_OK(dm_layer_forward(A));
        CHECK_OK(dm_layer_backward(A));
        CHECK_OK(dm_layer_forward(B));
        CHECK_OK(dm_layer_backward(B));
        CHECK(dm_layer_tensor(B, "grad_hidden_states", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
        double worst = 0;
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            char name[96];
            snprintf(name, sizeof name, "%s.grad", dm_param_names[k]);
            float *ga, *gb;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_layer_tensor(A, name, &ga, &nd, sh));
            CHECK_OK(dm_layer_tensor(B, name, &gb, NULL, NULL));
            double e = rel_err(gb, ga, (size_t)(nd == 1 ? sh[0] : sh[0] * sh[1]));
            worst = worst_of(worst, e);
        }
        CHECK(worst == 0.0); /* bit-identical: the same groups compute the parameter gradients */
        double fa[2][DM_NUM_CLASSES], fb[2][DM_NUM_CLASSES];
        dm_layer_flop(A, fa);
        dm_layer_flop(B, fb);
        const double gemm = 2.0 * 2 * 12 * 32 * (3 * 32); /* dX = dQKV . Wqkv: 2 b j i (3 i) */
        CHECK(fabs((fa[1][DM_CLASS_CONTRACTION] - fb[1][DM_CLASS_CONTRACTION]) - gemm) < 0.5);
        CHECK(fa[0][DM_CLASS_CONTRACTION] == fb[0][DM_CLASS_CONTRACTION]);
        printf("no input gradient (%s): parameter gradients within %.1e, backward contraction flop %.0f less\n",
               sched ? "unfused" : "fused", worst, fa[1][DM_CLASS_CONTRACTION] - fb[1][DM_CLASS_CONTRACTION]);
        dm_layer_free(A);
        dm_layer_free(B);
    }
}

/* --- learning, and refusing to learn from NaN ------------------------------------------ */

static void test_learns(void) {
    dm_layer_config cfg = tiny();
    cfg.dropout = 0.0;
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 2e-3;
    dm_layer_options fo = {.forward_only = 1};
    dm_trainer *S = NULL, *Tc = NULL;
    CHECK_OK(dm_trainer_new(&S, &cfg, 2, NULL, &a));
    CHECK_OK(dm_trainer_new(&Tc, &cfg, 2, &fo, NULL));
    if (!S || !Tc) goto out;
    CHECK_OK(dm_trainer_init_params(S, 1));
    CHECK_OK(dm_trainer_init_params(Tc, 2));
    CHECK(dm_trainer_step(Tc, NULL) == DM_ERR_INVALID_ARG); /* forward-only */
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            char name[128];
            snprintf(name, sizeof name, "encoder.layer.%d.%s", l, dm_param_names[k]);
            float *p;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_trainer_tensor(Tc, name, &p, &nd, sh));
            if (nd == 2)
                for (int64_t e = 0; e < sh[0] * sh[1]; e++) p[e] *= 5.0f;
        }
    float *sx, *st, *sm, *tx, *ty, *tm;
    CHECK_OK(dm_trainer_tensor(S, "hidden_states", &sx, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(S, "target", &st, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(S, "attention_mask", &sm, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(Tc, "hidden_states", &tx, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(Tc, "output", &ty, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(Tc, "attention_mask", &tm, NULL, NULL));
    const int64_t n = cfg.batch * cfg.seq * cfg.hidden;
    enum { STEPS = 80 };
    double loss[STEPS];
    for (int s = 1; s <= STEPS; s++) {
        batch_of(S, s); /* random inputs and mask ... */
        memcpy(tx, sx, (size_t)n * 4);
        memcpy(tm, sm, (size_t)(cfg.batch * cfg.seq) * 4);
        CHECK_OK(dm_trainer_forward(Tc, NULL)); /* ... the teacher's outputs as targets */
        memcpy(st, ty, (size_t)n * 4);
        CHECK_OK(dm_trainer_step(S, &loss[s - 1]));
    }
    double first = 0, last = 0;
    for (int k = 0; k < 5; k++) first += loss[k] / 5, last += loss[STEPS - 1 - k] / 5;
    printf("learning a teacher (2 layers, %d steps): loss %.4f -> %.4f\n", STEPS, first, last);
    CHECK(last < 0.5 * first);

    /* a NaN target: the step stops before updating anything */
    size_t n0, n1;
    float *before = snapshot(S, &n0);
    st[3] = NAN;
    double l = 0;
    CHECK(dm_trainer_step(S, &l) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "--lr"));
    float *after = snapshot(S, &n1);
    CHECK(before && after && n0 == n1 && memcmp(before, after, n0 * 4) == 0);
    CHECK(dm_trainer_step_count(S) == STEPS);
    free(before);
    free(after);
    /* its memory: the layers' together, and AdamW's two moments per parameter */
    {
        dm_layer_memory sum, one;
        size_t opt_bytes = 0;
        dm_trainer_memory_info(S, &sum, &opt_bytes);
        dm_layer *L = NULL;
        dm_layer_options lo = {.threads = 2};
        CHECK_OK(dm_layer_new(&L, &cfg, &lo));
        dm_layer_memory_info(L, &one);
        /* its flop: two layers', less the first one's input gradient: its GEMM (2 b j i 3i)
         * and the add of the residual's gradient into it (b j i) */
        double f[2][DM_NUM_CLASSES], one_flop = 0;
        dm_layer_flop(L, f);
        for (int p = 0; p < 2; p++)
            for (int c = 0; c < DM_NUM_CLASSES; c++) one_flop += f[p][c];
        const double bji = (double)cfg.batch * cfg.seq * cfg.hidden, dx = 2.0 * bji * 3 * cfg.hidden + bji;
        CHECK(fabs(dm_trainer_step_flop(S) - (2 * one_flop - dx)) < 0.5);
        dm_layer_free(L);
        /* the first layer builds no input gradient: its arena is a little smaller */
        CHECK(opt_bytes == (size_t)dm_trainer_num_params(S) * 8 && sum.arena > one.arena &&
              sum.arena <= 2 * one.arena && sum.parameters == 2 * one.parameters && sum.activations > 0);
        printf("memory: arenas %zu bytes (one layer alone %zu), AdamW %zu\n", sum.arena, one.arena, opt_bytes);
    }
out:
    dm_trainer_free(S);
    dm_trainer_free(Tc);
}

static void test_errors(void) {
    dm_layer_config cfg = tiny();
    dm_trainer *T = NULL;
    CHECK(dm_trainer_new(&T, &cfg, 0, NULL, NULL) == DM_ERR_INVALID_ARG && !T);
    CHECK(dm_trainer_new(&T, &cfg, 257, NULL, NULL) == DM_ERR_INVALID_ARG && !T);
    dm_layer_options cu = {.device = DM_DEVICE_CUDA};
#ifndef DM_HAVE_CUDA
    CHECK(dm_trainer_new(&T, &cfg, 1, &cu, NULL) == DM_ERR_UNSUPPORTED && !T && strstr(dm_last_error(), "without CUDA"));
#else
    {
        const char *was = getenv("DMOVE_CUDA_EMULATE");
        char keep[16];
        snprintf(keep, sizeof keep, "%s", was ? was : "");
        setenv("DMOVE_CUDA_EMULATE", "yes", 1);
        CHECK(dm_trainer_new(&T, &cfg, 1, &cu, NULL) == DM_ERR_INVALID_ARG && !T &&
              strstr(dm_last_error(), "DMOVE_CUDA_EMULATE='yes'"));
        if (was) setenv("DMOVE_CUDA_EMULATE", keep, 1);
        else unsetenv("DMOVE_CUDA_EMULATE");
    }
#endif
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = -1;
    CHECK(dm_trainer_new(&T, &cfg, 1, NULL, &a) == DM_ERR_INVALID_ARG && !T);
    cfg.heads = 3;
    CHECK(dm_trainer_new(&T, &cfg, 1, NULL, NULL) == DM_ERR_INVALID_ARG && !T);
    cfg = tiny();
    CHECK_OK(dm_trainer_new(&T, &cfg, 2, NULL, NULL));
    float *p;
    CHECK(dm_trainer_tensor(T, "encoder.layer.2.output.dense.bias", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
    CHECK(dm_trainer_tensor(T, "encoder.layer.1.output.dense.nothing", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
    CHECK(dm_trainer_tensor(T, "encoder.layer.x.output.dense.bias", &p, NULL, NULL) == DM_ERR_NOT_FOUND);
    CHECK_OK(dm_trainer_tensor(T, "encoder.layer.1.output.dense.bias.exp_avg_sq", &p, NULL, NULL));
    CHECK(dm_trainer_load(T, "/nonexistent/ckpt.safetensors") == DM_ERR_IO);
    dm_trainer_free(T);
}

/* --- the loss chart ---------------------------------------------------------------------- */

typedef struct {
    int circles, polylines, depth_err;
} svg_count;

static void XMLCALL on_start(void *u, const XML_Char *name, const XML_Char **attr) {
    svg_count *c = u;
    (void)attr;
    if (!strcmp(name, "circle")) c->circles++;
    if (!strcmp(name, "polyline")) c->polylines++;
}

static void test_chart(void) {
    char path[] = "/tmp/dmove_test_loss.XXXXXX";
    if (!temp_file(path)) return;
    double loss[40];
    for (int k = 0; k < 40; k++) loss[k] = 3.0 * exp(-0.2 * k) + 0.01; /* over two decades: log scale */
    for (int pass = 0; pass < 2; pass++) {
        if (pass) for (int k = 0; k < 40; k++) loss[k] = 1.0 + 0.01 * k; /* linear scale */
        CHECK_OK(dm_loss_svg(loss, 40, 11, "a <title> & \"quotes\"", path));
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (!f) return;
        char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        XML_Parser x = XML_ParserCreate(NULL);
        svg_count c = {0};
        XML_SetUserData(x, &c);
        XML_SetElementHandler(x, on_start, NULL);
        int ok = XML_Parse(x, buf, (int)n, 1) == XML_STATUS_OK;
        XML_ParserFree(x);
        CHECK(ok);
        CHECK(c.circles == 40 && c.polylines == 1);
        CHECK(strstr(buf, pass ? "mean squared error)" : "log scale") != NULL);
    }
    /* a long run: its running mean as a second line, no per-step markers */
    enum { LONG = 300 };
    double many[LONG];
    for (int k = 0; k < LONG; k++) many[k] = 1.0 / (1 + k) + 0.05 * ((k * 7919) % 13) / 13.0;
    CHECK_OK(dm_loss_svg(many, LONG, 1, "long", path));
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        static char buf[1 << 17];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        XML_Parser x = XML_ParserCreate(NULL);
        svg_count c = {0};
        XML_SetUserData(x, &c);
        XML_SetElementHandler(x, on_start, NULL);
        CHECK(XML_Parse(x, buf, (int)n, 1) == XML_STATUS_OK);
        XML_ParserFree(x);
        CHECK(c.circles == 0 && c.polylines == 2 && strstr(buf, "mean of the last 7 steps"));
    }
    CHECK(dm_loss_svg(loss, 0, 1, "t", path) == DM_ERR_INVALID_ARG);
    unlink(path);
}

/* The chart of a run with held-out evaluations: a loss panel (training per step, its
 * running mean, the held-out line and a marker per evaluation) over an accuracy panel;
 * valid XML; bad arguments refused. */
static void test_train_chart(void) {
    char path[] = "/tmp/dmove_test_chart.XXXXXX";
    if (!temp_file(path)) return;
    enum { N = 120, E = 6 };
    double loss[N], acc[N], el[E], ea[E];
    int64_t es[E];
    for (int k = 0; k < N; k++) loss[k] = 9.0 - 3.0 * k / N + 0.2 * ((k * 31) % 7) / 7.0, acc[k] = 0.3 * k / N;
    acc[5] = NAN; /* a step that scored nothing: no point */
    for (int k = 0; k < E; k++) es[k] = 21 + 20 * k, el[k] = 8.5 - 0.5 * k, ea[k] = 0.05 * k;
    dm_train_chart c = {.title = "run <1> & \"2\"", .loss_name = "masked-LM loss", .acc_name = "accuracy",
                        .loss = loss, .train_acc = acc, .n = N, .first_step = 21, .eval_step = es,
                        .eval_loss = el, .eval_acc = ea, .neval = E};
    for (int pass = 0; pass < 2; pass++) {
        if (pass) c.train_acc = NULL, c.eval_acc = NULL; /* the loss panel alone */
        CHECK_OK(dm_train_chart_svg(&c, path));
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (!f) break;
        static char buf[1 << 17];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        XML_Parser x = XML_ParserCreate(NULL);
        svg_count sc = {0};
        XML_SetUserData(x, &sc);
        XML_SetElementHandler(x, on_start, NULL);
        CHECK(XML_Parse(x, buf, (int)n, 1) == XML_STATUS_OK);
        XML_ParserFree(x);
        /* loss: per step + mean + held-out; accuracy: the same three */
        CHECK(sc.polylines == (pass ? 3 : 6) && sc.circles == (pass ? E : 2 * E));
        CHECK(strstr(buf, "step 101: held-out loss 6.5") != NULL && strstr(buf, "masked-LM loss") != NULL);
        CHECK(pass || strstr(buf, "step 61: held-out accuracy 0.1") != NULL);
    }
    dm_train_chart bad = c;
    bad.neval = -1;
    CHECK(dm_train_chart_svg(&bad, path) == DM_ERR_INVALID_ARG);
    bad = c, bad.eval_loss = NULL;
    CHECK(dm_train_chart_svg(&bad, path) == DM_ERR_INVALID_ARG);
    bad = c, bad.first_step = INT64_MAX - 3;
    CHECK(dm_train_chart_svg(&bad, path) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "overflow"));
    bad = c, bad.n = 0, bad.neval = 0;
    CHECK(dm_train_chart_svg(&bad, path) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "nothing"));
    CHECK(dm_train_chart_svg(NULL, path) == DM_ERR_INVALID_ARG && dm_train_chart_svg(&c, NULL) == DM_ERR_INVALID_ARG);
    unlink(path);
}

#ifdef DM_HAVE_CUDA
/* --- the stack on the CUDA backend ------------------------------------------------------
 * Run where main() says: on the emulated executor (DMOVE_CUDA_EMULATE=1, set by main when
 * no GPU is asked for), which runs the trainer's kernels' per-element code on the host, or
 * on a GPU. */

/* Steps 1..steps of trainer T on batch_of's data; the losses. */
static void run_steps(dm_trainer *T, int64_t from, int64_t to, double *loss) {
    for (int64_t s = from; s <= to; s++) {
        batch_of(T, s);
        CHECK_OK(dm_trainer_step(T, &loss[s - from]));
    }
}

/* Largest per-tensor relative error between the states of A and B (the parameters from
 * `from` = 0, only the moments from 1), and which tensor. Not the key bias: softmax does
 * not change when a row's scores all shift alike, so its gradient is zero but for rounding
 * (1e-14 here), and its state is that rounding's. */
static double state_err(dm_trainer *A, dm_trainer *B, int from, char *which, size_t n) {
    double worst = 0;
    for (int l = 0; l < dm_trainer_layers(A); l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++)
            for (int q = from; q < 3 && strcmp(dm_param_names[k], "attention.self.key.bias") != 0; q++) {
                char name[160];
                size_t m = 0, mb = 0;
                const float *a = param_of(A, l, k, k_state[q], &m, name), *b = param_of(B, l, k, k_state[q], &mb, name);
                if (!a || !b || m != mb) return INFINITY;
                double e = rel_err(a, b, m);
                if (!(e <= worst)) {
                    worst = worst_of(worst, e);
                    snprintf(which, n, "%s", name);
                }
            }
    return worst;
}

/* One more step of G (its update `s`) redone on the host: AdamW (adamw.c) from G's state
 * before the step with G's own gradients gives G's state after it. The largest relative
 * error over every parameter and moment. */
static double adamw_redone(dm_trainer *G, int64_t s, const dm_optim_config *a) {
    size_t n0 = 0, n1 = 0;
    float *before = snapshot(G, &n0); /* per tensor: the parameter, then its two moments */
    batch_of(G, s);
    CHECK_OK(dm_trainer_step(G, NULL));
    float *after = snapshot(G, &n1);
    double worst = before && after && n0 == n1 ? 0 : INFINITY;
    size_t at = 0;
    for (int l = 0; l < dm_trainer_layers(G) && worst < INFINITY; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            char name[160];
            size_t m;
            const float *g = param_of(G, l, k, ".grad", &m, name);
            if (!g) return INFINITY;
            float *p = before + at, *mo = p + m, *v = mo + m;
            const int decay = G->slot[l * DM_NUM_PARAMS + k].decay; /* the trainer's own rule */
            dm_adamw_update(p, g, mo, v, (int64_t)m, dm_optim_lr(a, s), decay ? a->weight_decay : 0.0, a, s);
            for (int w = 0; w < 3; w++) {
                double e = rel_err(after + at + w * m, before + at + w * m, m);
                worst = worst_of(worst, e);
            }
            at += 3 * m;
        }
    free(before);
    free(after);
    return worst;
}

static void test_gpu_trainer(void) {
    const dm_layer_config cfg = tiny();
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 1e-3, a.warmup = 1, a.total = 8;
    enum { STEPS = 4 };
    /* fp32, bf16, and fp32 with the weight gradients on a second stream (emulated: each
     * such group deferred to the last moment the waits allow, so a missed wait, e.g.
     * AdamW's or a copy between layers', gives other numbers) */
    const dm_dtype dts[3] = {DM_DTYPE_FP32, DM_DTYPE_BF16, DM_DTYPE_FP32};
    char path[] = "/tmp/dmove_test_gpuckpt.XXXXXX";
    if (!temp_file(path)) return;
    for (int v = 0; v < 3; v++) {
        const int q = v == 1; /* 16-bit storage */
        dm_layer_options go = {.device = DM_DEVICE_CUDA, .dtype = dts[v], .streams = v == 2 ? 2 : 1};
        dm_trainer *C = NULL, *G = NULL, *R = NULL, *H = NULL;
        CHECK_OK(dm_trainer_new(&C, &cfg, 3, NULL, &a));
        CHECK_OK(dm_trainer_new(&G, &cfg, 3, &go, &a));
        CHECK_OK(dm_trainer_new(&R, &cfg, 3, &go, &a));
        if (!C || !G || !R) goto next;
        CHECK_OK(dm_trainer_init_params(C, 5));
        CHECK_OK(dm_trainer_init_params(G, 5));
        if (v == 2) { /* the weight gradients do run on the second stream */
            CHECK(dm_layer_note_value(G->L[1], "second_stream", 0) > 0);
        }
        /* the same steps on the CPU and on the GPU: the same losses and state, within the
         * storage type's rounding (fp32 storage: only the summation orders differ) */
        double lc[STEPS], lg[STEPS], lr[STEPS];
        run_steps(C, 1, STEPS, lc);
        run_steps(G, 1, 2, lg);
        CHECK_OK(dm_trainer_save(G, path)); /* pulls the GPU's state */
        run_steps(G, 3, STEPS, lg + 2);
        double worst_loss = 0;
        for (int s = 0; s < STEPS; s++) {
            double e = fabs(lg[s] - lc[s]) / lc[s];
            worst_loss = worst_of(worst_loss, e);
        }
        /* bf16: the moments (the gradients' averages) within bf16's rounding through three
         * layers; not the parameters: AdamW's first steps move each by about lr times the
         * sign of its gradient, and the biases start at zero, so a gradient element near
         * zero whose sign the rounding flips is a large relative change of a small bias */
        char which[160] = "";
        const double err = state_err(G, C, q, which, sizeof which), tol = q ? 3e-2 : 1e-5;
        printf("3-layer stack, %d steps on the CUDA backend (%s) vs the CPU: losses within %.2e, %s within %.2e "
               "(%s)\n", STEPS, v == 2 ? "fp32, 2 streams" : dm_dtype_name(dts[v]), worst_loss, q ? "moments" : "parameters and moments", err,
               which);
        CHECK(worst_loss < (q ? 1e-2 : 1e-6));
        CHECK(err < tol);
        /* resumed from the checkpoint of step 2: bit-identical to the uninterrupted run */
        CHECK_OK(dm_trainer_init_params(R, 9));
        CHECK_OK(dm_trainer_load(R, path));
        run_steps(R, 3, STEPS, lr);
        CHECK(same_state(G, R) && lr[0] == lg[2] && lr[1] == lg[3]);
        printf("  checkpoint at step 2, resumed on the GPU: %s\n", same_state(G, R) ? "bit-identical" : "DIFFERENT");
        /* a checkpoint of the GPU trainer is the CPU trainer's too: its fp32 master weights */
        CHECK_OK(dm_trainer_new(&H, &cfg, 3, NULL, &a));
        if (H) {
            CHECK_OK(dm_trainer_load(H, path));
            CHECK(dm_trainer_step_count(H) == 2);
        }
        /* after a step, asking for one parameter brings that one down, and only it goes up
         * again (the host copies are a cache per parameter) */
        {
            batch_of(G, STEPS + 1);
            CHECK_OK(dm_trainer_step(G, NULL));
            float *w;
            CHECK_OK(dm_trainer_tensor(G, "encoder.layer.2.attention.output.dense.weight", &w, NULL, NULL));
            const int want = 2 * DM_NUM_PARAMS + 6; /* attention.output.dense.weight: the 7th */
            int others = 0;
            for (int k = 0; k < 3 * DM_NUM_PARAMS; k++)
                if (k != want) others += !G->slot[k].host_stale || G->slot[k].dirty;
            CHECK(!strcmp(dm_param_names[6], "attention.output.dense.weight"));
            CHECK(!G->slot[want].host_stale && G->slot[want].dirty && others == 0);
            /* that step again on the CPU, so that the two stay comparable */
            batch_of(C, STEPS + 1);
            CHECK_OK(dm_trainer_step(C, NULL));
        }
        /* a parameter written on the host reaches the GPU at the next step */
        {
            float *w, *w2;
            int64_t sh[4];
            CHECK_OK(dm_trainer_tensor(G, "encoder.layer.1.output.dense.bias", &w, NULL, sh));
            for (int64_t e = 0; e < sh[0]; e++) w[e] += 0.5f;
            CHECK_OK(dm_trainer_tensor(C, "encoder.layer.1.output.dense.bias", &w2, NULL, NULL));
            for (int64_t e = 0; e < sh[0]; e++) w2[e] += 0.5f;
            double l1 = 0, l2 = 0;
            batch_of(G, STEPS + 2);
            batch_of(C, STEPS + 2);
            CHECK_OK(dm_trainer_forward(G, &l1));
            CHECK_OK(dm_trainer_forward(C, &l2));
            CHECK(fabs(l1 - l2) < (q ? 1e-2 : 1e-6) * l2);
            printf("  a bias changed on the host: forward loss %.6f on the GPU, %.6f on the CPU\n", l1, l2);
        }
        /* the GPU's update is AdamW on the GPU's gradients, its master weights in fp32 */
        {
            const double e = adamw_redone(G, STEPS + 2, &a);
            printf("  update %d redone on the host from the GPU's state and gradients: within %.2e\n", STEPS + 2, e);
            CHECK(e < 1e-6);
        }
        /* memory: the master weights (16-bit storage) beside the two moments; the device
         * workspace */
        {
            dm_layer_memory m;
            size_t opt_bytes = 0;
            dm_trainer_memory_info(G, &m, &opt_bytes);
            CHECK(opt_bytes == (size_t)dm_trainer_num_params(G) * (q ? 12 : 8));
            CHECK(m.scratch > 0); /* the executors' workspaces beside their arenas */
            /* the three layers share one set of main-stream buffers (the tile temporaries
             * above all): less than three layers' own workspaces */
            dm_layer *L = NULL;
            dm_layer_memory one;
            CHECK_OK(dm_layer_new(&L, &cfg, &go));
            dm_layer_memory_info(L, &one);
            dm_layer_free(L);
            const size_t pool = dm_trainer_pool_bytes(G);
            printf("  GPU workspace of the 3 layers: %zu bytes, of them %zu shared (one layer alone: %zu)\n",
                   m.scratch, pool, one.scratch);
            CHECK(pool > 0 && m.scratch < 3 * one.scratch && m.scratch + 2 * pool <= 3 * one.scratch + 3 * 256);
        }
        /* an update that failed part way (white-box: marked so): nothing goes on but a load */
        {
            G->broken = STEPS + 3;
            float *w;
            double l = 0;
            char bad[] = "/tmp/dmove_test_broken.XXXXXX";
            CHECK(dm_trainer_forward(G, &l) == DM_ERR_BACKEND && strstr(dm_last_error(), "--resume"));
            CHECK(dm_trainer_step(G, &l) == DM_ERR_BACKEND);
            CHECK(temp_file(bad) && dm_trainer_save(G, bad) == DM_ERR_BACKEND);
            unlink(bad);
            CHECK(dm_trainer_tensor(G, "encoder.layer.0.output.dense.bias", &w, NULL, NULL) == DM_ERR_BACKEND);
            CHECK_OK(dm_trainer_load(G, path));
            batch_of(G, 3);
            CHECK_OK(dm_trainer_step(G, &l));
        }
    next:
        dm_trainer_free(C);
        dm_trainer_free(G);
        dm_trainer_free(R);
        dm_trainer_free(H);
    }
    unlink(path);
}
#endif

int main(void) {
#ifdef DM_HAVE_CUDA
    /* the GPU trainer's tests run on the emulated CUDA backend unless a GPU is asked for */
    const char *gpu = getenv("DMOVE_TEST_GPU");
    if (!gpu || strcmp(gpu, "1") != 0) setenv("DMOVE_CUDA_EMULATE", "1", 1);
#endif
    const char *ref = REF_DIR "/train_stack.safetensors";
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(ref, &f));
    if (f) {
        test_adamw_torch(f);
        test_stack_torch(f, ref, DM_DEVICE_CPU);
#ifdef DM_HAVE_CUDA
        test_stack_torch(f, ref, DM_DEVICE_CUDA);
#endif
        dm_st_free(f);
    }
    test_adamw_naive();
    test_schedule();
    test_no_input_grad();
    test_learns();
    test_errors();
    test_chart();
    test_train_chart();
#ifdef DM_HAVE_CUDA
    test_gpu_trainer();
#endif
    TEST_END();
}
