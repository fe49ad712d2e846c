/* test_gradcheck.c: finite differences on a tiny layer. The loss is sum(output *
 * grad_output), accumulated in double; each checked parameter entry (and input entry)
 * is perturbed by +-h and the central difference compared with dmove's gradient.
 * dmove computes in fp32, so the difference quotient carries ~1e-4 of rounding noise;
 * the check is per tensor: ||fd - grad|| / ||grad|| < 1e-2, where a wrong rule gives O(1).
 * Dropout is on (fixed masks: the function stays smooth), with a padding mask; post-LN,
 * pre-LN and pre-LN causal layers. */
#include <stdlib.h>
#include <string.h>

#include "dmove.h"
#include "testutil.h"

static double loss(dm_layer *L, const float *dy, size_t n) {
    float *y;
    int nd;
    int64_t sh[4];
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_tensor(L, "output", &y, &nd, sh));
    double s = 0;
    for (size_t e = 0; e < n; e++) s += (double)y[e] * dy[e];
    return s;
}

static void run(dm_act act, dm_norm norm, int causal) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 3, cfg.hidden = 4, cfg.heads = 2, cfg.ffn = 6;
    cfg.dropout = 0.2, cfg.seed = 5, cfg.eps = 1e-5, cfg.act = act, cfg.norm = norm, cfg.causal = causal;
    printf("%s, %s-LN%s:\n", dm_act_name(act), dm_norm_name(norm), causal ? ", causal" : "");
    dm_layer *L = NULL;
    dm_layer_options opt = {.threads = 1};
    CHECK_OK(dm_layer_new(&L, &cfg, &opt));
    if (!L) return;
    CHECK_OK(dm_layer_init_params(L, 3));
    float *p, *dy, *mask;
    int nd;
    int64_t sh[4];
    uint64_t st = 12345;
    /* weights larger than BERT's 0.02 so every path carries gradient */
    for (int q = 0; q < dm_layer_num_params(L); q++) {
        CHECK_OK(dm_layer_tensor(L, dm_layer_param_name(L, q), &p, &nd, sh));
        int64_t n = nd == 1 ? sh[0] : sh[0] * sh[1];
        for (int64_t e = 0; e < n; e++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(st >> 11) / 9007199254740992.0 - 0.5;
            const char *nm = dm_layer_param_name(L, q);
            double scale = strstr(nm, "self.query.weight") || strstr(nm, "self.key.weight") ? 3.0 : 0.8;
            p[e] = strstr(nm, "LayerNorm.weight") ? (float)(1 + 0.4 * u) : (float)(scale * u);
        }
    }
    CHECK_OK(dm_layer_tensor(L, "hidden_states", &p, &nd, sh));
    size_t n = (size_t)(sh[0] * sh[1] * sh[2]);
    for (size_t e = 0; e < n; e++) p[e] = (float)sin(1.7 * (double)e + 0.3);
    CHECK_OK(dm_layer_tensor(L, "attention_mask", &mask, &nd, sh));
    mask[2] = 0; /* first sequence: last position is padding */
    CHECK_OK(dm_layer_tensor(L, "grad_output", &dy, &nd, sh));
    for (size_t e = 0; e < n; e++) dy[e] = (float)cos(0.9 * (double)e);
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));

    const char *extra[1] = {"hidden_states"};
    for (int q = -1; q < dm_layer_num_params(L); q++) {
        const char *name = q < 0 ? extra[0] : dm_layer_param_name(L, q);
        char gname[128];
        snprintf(gname, sizeof gname, "%s", q < 0 ? "grad_hidden_states" : name);
        if (q >= 0) snprintf(gname, sizeof gname, "%s.grad", name);
        float *x, *g;
        CHECK_OK(dm_layer_tensor(L, name, &x, &nd, sh));
        int64_t cnt = nd == 1 ? sh[0] : nd == 2 ? sh[0] * sh[1] : sh[0] * sh[1] * sh[2];
        CHECK_OK(dm_layer_tensor(L, gname, &g, &nd, sh));
        float *gcopy = malloc(sizeof(float) * (size_t)cnt);
        memcpy(gcopy, g, sizeof(float) * (size_t)cnt);
        double dd = 0, gg = 0;
        int64_t stride = cnt > 24 ? cnt / 24 : 1; /* up to ~24 entries per tensor */
        for (int64_t e = 0; e < cnt; e += stride) {
            float orig = x[e];
            double h = 1e-2;
            x[e] = (float)(orig + h);
            double lp = loss(L, dy, n);
            x[e] = (float)(orig - h);
            double lm = loss(L, dy, n);
            x[e] = orig;
            double fd = (lp - lm) / (2 * h);
            dd += (fd - gcopy[e]) * (fd - gcopy[e]);
            gg += (double)gcopy[e] * gcopy[e];
        }
        double rel = gg > 0 ? sqrt(dd / gg) : sqrt(dd);
        /* the key bias has an exactly zero gradient (softmax cancels it): absolute check */
        int ok = gg > 1e-12 ? rel < 1e-2 : sqrt(dd) < 1e-3;
        CHECK(ok);
        printf("  %-9s %-42s ||grad|| %.3e  fd rel.err %.2e %s\n", dm_act_name(act), gname, sqrt(gg),
               rel, ok ? "ok" : "FAIL");
        free(gcopy);
    }
    dm_layer_free(L);
}

int main(void) {
    run(DM_ACT_GELU, DM_NORM_POST, 0);
    run(DM_ACT_GELU_TANH, DM_NORM_POST, 0);
    /* the variants: their backward is autodiff's too */
    run(DM_ACT_GELU, DM_NORM_PRE, 0);
    run(DM_ACT_GELU, DM_NORM_PRE, 1);
    TEST_END();
}
