/* test_layer_ref.c: the whole layer (output and every gradient) against PyTorch
 * references in tests/ref/ (made by tests/ref/make_refs.py), for both schedules (and the
 * fused one with attention recomputed in the backward pass), with
 * dropout off and on (the references use dmove's Philox masks). Relative error per
 * tensor must be under 1e-5 (output) and 1e-4 (gradients); every error is printed. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "testutil.h"

static int run_case(const char *path) {
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(path, &f));
    if (!f) return 1;
    const dm_st_tensor *x = dm_st_find(f, "hidden_states");
    const dm_st_tensor *w1 = dm_st_find(f, "intermediate.dense.weight");
    CHECK(x && w1 && x->ndim == 3);
    if (!x || !w1) { dm_st_free(f); return 1; }
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = x->shape[0];
    cfg.seq = x->shape[1];
    cfg.hidden = x->shape[2];
    cfg.ffn = w1->shape[0];
    cfg.heads = atoll(dm_st_metadata(f, "heads"));
    cfg.dropout = atof(dm_st_metadata(f, "dropout"));
    cfg.eps = atof(dm_st_metadata(f, "eps"));
    cfg.seed = strtoull(dm_st_metadata(f, "seed"), NULL, 10);
    CHECK_OK(dm_act_parse(dm_st_metadata(f, "act"), &cfg.act));
    /* the layer variants' files say so; the first ones are post-LN and bidirectional */
    const char *norm = dm_st_metadata(f, "norm"), *causal = dm_st_metadata(f, "causal");
    if (norm) CHECK_OK(dm_norm_parse(norm, &cfg.norm));
    if (causal) cfg.causal = atoi(causal);
    printf("%s: b=%lld j=%lld i=%lld h=%lld u=%lld p=%g act=%s %s-LN%s\n", path, (long long)cfg.batch,
           (long long)cfg.seq, (long long)cfg.hidden, (long long)cfg.heads, (long long)cfg.ffn,
           cfg.dropout, dm_act_name(cfg.act), dm_norm_name(cfg.norm), cfg.causal ? " causal" : "");
    /* the file has all 18 expected tensors: output, grad_hidden_states and the 16
     * parameters' gradients (a reference missing one would check less, silently) */
    int expected = 0, present = 0;
    for (int k = -2; k < DM_NUM_PARAMS; k++) {
        char name[128];
        snprintf(name, sizeof name, "expected.%s%s", k == -2 ? "output" : k == -1 ? "grad_hidden_states"
                 : dm_param_names[k], k >= 0 ? ".grad" : "");
        expected++;
        present += dm_st_find(f, name) != NULL;
        if (!dm_st_find(f, name)) printf("  %s: no %s in the reference\n", path, name);
    }
    CHECK(expected == 18 && present == 18);
    /* fused, unfused, and fused with attention recomputed in the backward pass */
    for (int run = 0; run < 3; run++) {
        const int sched = run == 1;
        dm_layer *L = NULL;
        dm_layer_options opt = {.schedule = sched, .recompute = run == 2};
        CHECK_OK(dm_layer_new(&L, &cfg, &opt));
        if (!L) continue;
        /* inputs: every tensor in the file without the "expected." prefix */
        for (int k = 0; k < dm_st_count(f); k++) {
            const dm_st_tensor *t = dm_st_get(f, k);
            if (!strncmp(t->name, "expected.", 9)) continue;
            float *p;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_layer_tensor(L, t->name, &p, &nd, sh));
            size_t n = 1;
            for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
            CHECK_OK(dm_st_to_f32(t, p, n));
        }
        CHECK_OK(dm_layer_forward(L));
        CHECK_OK(dm_layer_backward(L));
        for (int k = 0; k < dm_st_count(f); k++) {
            const dm_st_tensor *t = dm_st_get(f, k);
            if (strncmp(t->name, "expected.", 9)) continue;
            const char *name = t->name + 9;
            float *p;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_layer_tensor(L, name, &p, &nd, sh));
            size_t n = t->nbytes / 4;
            float *ref = malloc(n * sizeof(float));
            CHECK_OK(dm_st_to_f32(t, ref, n));
            double e = rel_err(p, ref, n);
            double tol = strcmp(name, "output") ? 1e-4 : 1e-5;
            int ok = e < tol;
            CHECK(ok);
            printf("  %-9s %-42s rel.err %.2e %s\n", run == 2 ? "recompute" : sched ? "unfused" : "fused", name, e,
                   ok ? "ok" : "FAIL");
            free(ref);
        }
        dm_layer_free(L);
    }
    dm_st_free(f);
    return 0;
}

int main(void) {
    const char *dir = getenv("DMOVE_REF_DIR") ? getenv("DMOVE_REF_DIR") : "tests/ref";
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) TEST_END();
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, "layer_", 6) && l > 12 && !strcmp(e->d_name + l - 12, ".safetensors"))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    CHECK(n >= 13); /* A, B, C (post-LN), P (pre-LN), Q (pre-LN, causal), R (causal); dropout off and on */
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        run_case(path);
        free(names[i]);
    }
    TEST_END();
}
