/* test_optim.c: the trainer's optimizers against PyTorch (tests/ref/optim.safetensors, made
 * by tests/ref/make_optim_ref.py): AdamW (torch.optim.AdamW) and LAMB (NVIDIA's FusedLAMB's
 * definition), with gradient accumulation, global-norm clipping (clip_grad_norm_) and the
 * polynomial schedule, on the CPU backend and the CUDA backend (emulated without a GPU);
 * then what only a training run shows: K micro-batches give the update one batch of K times
 * the rows gives, a checkpoint resumes bit-identically, a gradient that is not finite
 * changes nothing, and the settings are checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "layer/layer_internal.h"
#include "testutil.h"
#include "train/train.h"
#include "train/trainer_internal.h"
#include "trainutil.h"

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

/* The reference's layer: i=8, u=12, one token pair, no dropout. */
static dm_layer_config ref_layer(void) {
    dm_layer_config c;
    dm_layer_config_default(&c);
    c.batch = 1, c.seq = 2, c.hidden = 8, c.heads = 2, c.ffn = 12, c.dropout = 0.0;
    return c;
}

static double meta_num(const dm_st_file *f, const char *cs, const char *key) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", cs, key);
    const char *v = dm_st_metadata(f, k);
    CHECK(v != NULL);
    return v ? strtod(v, NULL) : NAN;
}

static void case_config(const dm_st_file *f, const char *cs, dm_optim_config *c, int *K) {
    dm_optim_config_default(c);
    char k[64];
    snprintf(k, sizeof k, "%s.kind", cs);
    const char *kind = dm_st_metadata(f, k);
    c->kind = kind && !strcmp(kind, "lamb") ? DM_OPT_LAMB : DM_OPT_ADAMW;
    c->lr = meta_num(f, cs, "lr");
    c->beta1 = meta_num(f, cs, "beta1");
    c->beta2 = meta_num(f, cs, "beta2");
    c->eps = meta_num(f, cs, "eps");
    c->weight_decay = meta_num(f, cs, "weight_decay");
    c->warmup = (int64_t)meta_num(f, cs, "warmup");
    c->total = (int64_t)meta_num(f, cs, "total");
    c->power = meta_num(f, cs, "power");
    c->lr_end = meta_num(f, cs, "lr_end");
    c->clip_norm = meta_num(f, cs, "clip");
    *K = (int)meta_num(f, cs, "K");
    c->accumulate = *K;
}

/* Tensor `name` of the reference into dst (n floats). */
static int ref_into(const dm_st_file *f, const char *name, float *dst, size_t n) {
    const dm_st_tensor *t = dm_st_find(f, name);
    CHECK(t != NULL);
    return t && dm_st_to_f32(t, dst, n) == DM_OK;
}

/* One case on one backend: the reference's start, its gradients written into the layer's
 * gradient tensors and sent to the backend (white-box), accumulated and updated as
 * dm_trainer_step does; the state after three updates against the reference. */
static void run_case(const dm_st_file *f, const char *cs, dm_device_kind dev) {
    const dm_layer_config cfg = ref_layer();
    dm_optim_config oc;
    int K = 1;
    case_config(f, cs, &oc, &K);
    dm_layer_options lo = {.device = dev};
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new(&T, &cfg, 1, &lo, &oc));
    if (!T) return;
    char name[192];
    for (int k = 0; k < DM_NUM_PARAMS; k++) {
        float *p;
        snprintf(name, sizeof name, "encoder.layer.0.%s", dm_param_names[k]);
        CHECK_OK(dm_trainer_tensor(T, name, &p, NULL, NULL)); /* marks it to go up */
        snprintf(name, sizeof name, "p0.%s", dm_param_names[k]);
        ref_into(f, name, p, (size_t)T->slot[k].n);
    }
    const int updates = (int)strtol(dm_st_metadata(f, "updates") ? dm_st_metadata(f, "updates") : "0", NULL, 10);
    CHECK(updates == 3);
    for (int u = 1; u <= updates; u++) {
        CHECK_OK(dm_trainer_push(T));
        for (int m = 0; m < K; m++) {
            for (int k = 0; k < DM_NUM_PARAMS; k++) {
                snprintf(name, sizeof name, "g.%d.%d.%s", u, m, dm_param_names[k]);
                ref_into(f, name, T->slot[k].g, (size_t)T->slot[k].n);
                CHECK_OK(T->bk->upload(T->L[0]->st, T->slot[k].tg, T->slot[k].g));
            }
            if (K > 1) CHECK_OK(dm_trainer_accumulate(T, m == 0));
        }
        CHECK_OK(dm_trainer_update(T, u, K > 1));
        T->step = u;
    }
    dm_trainer_grads_new(T); /* the backend's state is newer than the host's */
    double worst = 0.0;
    const char *which = "";
    static const char *const part[3] = {"p", "m", "v"};
    for (int k = 0; k < DM_NUM_PARAMS; k++)
        for (int q = 0; q < 3; q++) {
            float *mine, *want = malloc((size_t)T->slot[k].n * sizeof(float));
            snprintf(name, sizeof name, "encoder.layer.0.%s%s", dm_param_names[k], k_state[q]);
            CHECK_OK(dm_trainer_tensor(T, name, &mine, NULL, NULL));
            snprintf(name, sizeof name, "%s.%s.%s", cs, part[q], dm_param_names[k]);
            if (want && ref_into(f, name, want, (size_t)T->slot[k].n)) {
                const double e = rel_err(mine, want, (size_t)T->slot[k].n);
                if (!(e <= worst)) worst = worst_of(worst, e), which = dm_param_names[k];
            }
            free(want);
        }
    printf("%s (%d micro-batch%s, clip %g, %s) on the %s backend, 3 updates vs PyTorch: worst rel.err %.2e (%s); "
           "gradient norm %.4g\n", cs, K, K > 1 ? "es" : "", oc.clip_norm, oc.total ? "decay" : "constant rate",
           dm_device_kind_name(dev), worst, which, dm_trainer_grad_norm(T));
    CHECK(worst < 1e-5);
    CHECK(oc.clip_norm > 0 || oc.kind == DM_OPT_LAMB ? dm_trainer_grad_norm(T) > 0 : dm_trainer_grad_norm(T) == -1.0);
    dm_trainer_free(T);
}

static void test_torch(dm_device_kind dev) {
    dm_st_file *f = NULL;
    CHECK_OK(dm_st_read(REF_DIR "/optim.safetensors", &f));
    if (!f) return;
    run_case(f, "adamw", dev);
    run_case(f, "lamb", dev);
    run_case(f, "lamb1", dev);
    dm_st_free(f);
}

/* Rows part*b .. part*b+b-1 of step s's big batch into T (b its batch): micro-batch `part`
 * of s; with part 0 and T's batch the big one, the whole batch. */
static void split_batch(dm_trainer *T, int64_t s, int part) {
    float *x, *t, *mask;
    int64_t sh[4];
    CHECK_OK(dm_trainer_tensor(T, "hidden_states", &x, NULL, sh));
    CHECK_OK(dm_trainer_tensor(T, "target", &t, NULL, NULL));
    CHECK_OK(dm_trainer_tensor(T, "attention_mask", &mask, NULL, NULL));
    const int64_t rows = sh[0], per_row = sh[1] * sh[2];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t R = (int64_t)part * rows + r; /* the row of the big batch */
        uint32_t w[2];
        for (int64_t e = 0; e < per_row; e++) {
            dm_philox_words(23, (uint32_t)s, (uint64_t)(R * per_row + e) * 2, 2, w);
            x[r * per_row + e] = (float)((double)w[0] / 4294967296.0 * 2 - 1);
            t[r * per_row + e] = (float)((double)w[1] / 4294967296.0 * 2 - 1);
        }
        for (int64_t j = 0; j < sh[1]; j++) mask[r * sh[1] + j] = 1.0f;
    }
}

/* K micro-batches of b rows make the update one batch of K*b rows makes (no dropout, no
 * padding: the mean of the micro-batches' mean losses is the big batch's), with LAMB and
 * clipping; a checkpoint between updates resumes bit-identically. */
static void test_accumulate(dm_device_kind dev) {
    enum { K = 3, STEPS = 3 };
    dm_layer_config small = tiny(), big;
    small.dropout = 0.0;
    small.batch = 1;
    big = small;
    big.batch = K;
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.kind = DM_OPT_LAMB, a.lr = 1e-2, a.clip_norm = 0.1, a.warmup = 1, a.total = 5;
    dm_optim_config ab = a;
    a.accumulate = K;
    dm_layer_options lo = {.device = dev};
    dm_trainer *S = NULL, *B = NULL, *R = NULL;
    CHECK_OK(dm_trainer_new(&S, &small, 2, &lo, &a));
    CHECK_OK(dm_trainer_new(&B, &big, 2, &lo, &ab));
    CHECK_OK(dm_trainer_new(&R, &small, 2, &lo, &a));
    char path[] = "/tmp/dmove_test_accum.XXXXXX";
    if (!S || !B || !R || !temp_file(path)) goto out;
    CHECK_OK(dm_trainer_init_params(S, 4));
    CHECK_OK(dm_trainer_init_params(B, 4));
    double ls[STEPS], lb[STEPS];
    for (int s = 1; s <= STEPS; s++) {
        ls[s - 1] = 0.0;
        for (int m = 0; m < K; m++) {
            double l;
            split_batch(S, s, m);
            CHECK(dm_trainer_micro(S) == m);
            CHECK_OK(dm_trainer_step(S, &l));
            ls[s - 1] += l / K;
        }
        CHECK(dm_trainer_step_count(S) == s && dm_trainer_micro(S) == 0);
        split_batch(B, s, 0);
        CHECK_OK(dm_trainer_step(B, &lb[s - 1]));
        if (s == 1) CHECK_OK(dm_trainer_save(S, path));
    }
    size_t na = 0, nb = 0;
    float *sa = snapshot(S, &na), *sb = snapshot(B, &nb);
    const double e = sa && sb && na == nb ? rel_err(sa, sb, na) : INFINITY;
    double el = 0.0;
    for (int s = 0; s < STEPS; s++) el = fmax(el, fabs(ls[s] - lb[s]) / lb[s]);
    printf("%d micro-batches of 1 vs one batch of %d (LAMB, clipped, %s): losses within %.2e, state within %.2e; "
           "gradient norms %.6g and %.6g\n", K, K, dm_device_kind_name(dev), el, e, dm_trainer_grad_norm(S),
           dm_trainer_grad_norm(B));
    CHECK(el < 1e-6 && e < 1e-5);
    CHECK(fabs(dm_trainer_grad_norm(S) - dm_trainer_grad_norm(B)) < 1e-5 * dm_trainer_grad_norm(B));
    free(sa), free(sb);
    /* resumed after update 1: the same micro-batches give the very same state */
    CHECK_OK(dm_trainer_load(R, path));
    for (int s = 2; s <= STEPS; s++)
        for (int m = 0; m < K; m++) {
            split_batch(R, s, m);
            CHECK_OK(dm_trainer_step(R, NULL));
        }
    CHECK(same_state(S, R));
    printf("  checkpoint after update 1, resumed: %s\n", same_state(S, R) ? "bit-identical" : "DIFFERENT");
out:
    unlink(path);
    dm_trainer_free(S);
    dm_trainer_free(B);
    dm_trainer_free(R);
}

/* A gradient that is not finite: with clipping (or LAMB) the update is refused before any
 * change; the settings are checked. */
static void test_refusals(void) {
    dm_layer_config cfg = tiny();
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.clip_norm = 1.0;
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new(&T, &cfg, 1, NULL, &a));
    if (T) {
        CHECK_OK(dm_trainer_init_params(T, 1));
        batch_of(T, 1);
        CHECK_OK(dm_trainer_step(T, NULL));
        size_t n0 = 0, n1 = 0;
        float *before = snapshot(T, &n0);
        T->slot[3].g[0] = INFINITY; /* white-box: the backward's gradient, as if it overflowed */
        CHECK(dm_trainer_update(T, 2, 0) == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "gradient norm"));
        float *after = snapshot(T, &n1);
        CHECK(before && after && n0 == n1 && !memcmp(before, after, n0 * sizeof(float)) && !T->broken);
        free(before), free(after);
    }
    dm_trainer_free(T);
    const struct {
        const char *field;
        double v;
    } bad[] = {{"power", 0.0}, {"power", -1.0}, {"lr_end", 1.0}, {"clip_norm", -0.5}, {"clip_norm", INFINITY},
               {"accumulate", 0}, {"kind", 7}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dm_optim_config c;
        dm_optim_config_default(&c);
        if (!strcmp(bad[k].field, "power")) c.power = bad[k].v;
        if (!strcmp(bad[k].field, "lr_end")) c.lr_end = bad[k].v;
        if (!strcmp(bad[k].field, "clip_norm")) c.clip_norm = bad[k].v;
        if (!strcmp(bad[k].field, "accumulate")) c.accumulate = (int)bad[k].v;
        if (!strcmp(bad[k].field, "kind")) c.kind = (dm_optimizer)(int)bad[k].v;
        CHECK(dm_optim_config_check(&c) == DM_ERR_INVALID_ARG);
    }
    /* the polynomial schedule: power 2 from lr at update W+1 to lr_end after update total */
    dm_optim_config c;
    dm_optim_config_default(&c);
    c.lr = 1.0, c.warmup = 2, c.total = 6, c.power = 2.0, c.lr_end = 0.1;
    CHECK(dm_optim_lr(&c, 1) == 0.5 && dm_optim_lr(&c, 3) == 1.0);
    CHECK(fabs(dm_optim_lr(&c, 5) - (0.1 + 0.9 * 0.25)) < 1e-15 && dm_optim_lr(&c, 7) == 0.1);
}

/* The global gradient norm over tensors long enough for the CPU's running sums (each of
 * DM_NORM_PARTS parts many times NORM_LANES elements, and a remainder): the norm of the
 * gradients as written, to double rounding. */
static void test_grad_norm(dm_device_kind dev) {
    dm_layer_config cfg = ref_layer();
    cfg.hidden = 64, cfg.heads = 2, cfg.ffn = 260;
    dm_optim_config oc;
    dm_optim_config_default(&oc);
    oc.clip_norm = 1e-3;
    dm_layer_options lo = {.device = dev};
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new(&T, &cfg, 1, &lo, &oc));
    if (!T) return;
    CHECK_OK(dm_trainer_push(T));
    double want = 0.0;
    for (int k = 0; k < T->nslots; k++) {
        for (int64_t e = 0; e < T->slot[k].n; e++) {
            const float g = (float)((double)((uint32_t)(e * 2654435761u + (uint32_t)k * 40503u) % 2001u) - 1000.0) *
                            1e-3f * (float)(k + 1);
            T->slot[k].g[e] = g;
            want += (double)g * (double)g;
        }
        CHECK_OK(T->bk->upload(T->L[0]->st, T->slot[k].tg, T->slot[k].g));
    }
    want = sqrt(want);
    CHECK_OK(dm_trainer_update(T, 1, 0));
    const double got = dm_trainer_grad_norm(T);
    printf("gradient norm over %lld parameters on the %s backend: %.17g, in double %.17g\n",
           (long long)dm_trainer_num_params(T), dm_device_kind_name(dev), got, want);
    CHECK(fabs(got - want) <= 1e-12 * want);
    dm_trainer_free(T);
}

int main(void) {
#ifdef DM_HAVE_CUDA
    const char *gpu = getenv("DMOVE_TEST_GPU");
    if (!gpu || strcmp(gpu, "1") != 0) setenv("DMOVE_CUDA_EMULATE", "1", 1);
#endif
    test_torch(DM_DEVICE_CPU);
    test_accumulate(DM_DEVICE_CPU);
    test_grad_norm(DM_DEVICE_CPU);
#ifdef DM_HAVE_CUDA
    test_torch(DM_DEVICE_CUDA);
    test_accumulate(DM_DEVICE_CUDA);
#endif
    test_refusals();
    TEST_END();
}
