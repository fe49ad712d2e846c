/* test_checkpoint.c: the trainer's checkpoints and parameter files (on the CPU; the GPU
 * trainer's are in test_train.c):
 *  - a run checkpointed at step 3 of 6 and resumed equals the uninterrupted run, bit for
 *    bit; a flipped bit, a truncated file, another architecture and too few layers are
 *    refused with the trainer unchanged; a checkpoint without the variant keys loads;
 *  - thousands of damaged copies never crash the loader nor change the trainer;
 *  - parameters named as BERT checkpoints name them load exactly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "testutil.h"
#include "train/train.h"
#include "trainutil.h"

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static void test_checkpoints(void) {
    const dm_layer_config cfg = tiny();
    dm_optim_config a;
    dm_optim_config_default(&a);
    a.lr = 1e-3, a.warmup = 2, a.total = 6;
    char path[] = "/tmp/dmove_test_ckpt.XXXXXX";
    if (!temp_file(path)) return;
    dm_trainer *A = NULL, *B = NULL, *C = NULL;
    CHECK_OK(dm_trainer_new(&A, &cfg, 3, NULL, &a));
    CHECK_OK(dm_trainer_new(&B, &cfg, 3, NULL, &a));
    if (!A || !B) goto out;
    CHECK_OK(dm_trainer_init_params(A, 5));
    for (int64_t s = 1; s <= 6; s++) {
        batch_of(A, s);
        CHECK_OK(dm_trainer_step(A, NULL));
        if (s == 3) CHECK_OK(dm_trainer_save(A, path));
    }
    /* B: made afresh (other parameters), resumed from step 3, three more steps */
    CHECK_OK(dm_trainer_init_params(B, 6));
    CHECK_OK(dm_trainer_load(B, path));
    CHECK(dm_trainer_step_count(B) == 3);
    for (int64_t s = 4; s <= 6; s++) {
        batch_of(B, s);
        CHECK_OK(dm_trainer_step(B, NULL));
    }
    CHECK(same_state(A, B));
    printf("checkpoint at step 3 of 6, resumed: %s to the uninterrupted run\n", same_state(A, B) ? "bit-identical" : "DIFFERENT");

    /* corrupted files change nothing */
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    if (!fp) goto out;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *bytes = malloc((size_t)size);
    CHECK(bytes && fread(bytes, 1, (size_t)size, fp) == (size_t)size);
    fclose(fp);
    if (!bytes) goto out;
    char bad[sizeof path + 8];
    snprintf(bad, sizeof bad, "%s.bad", path);
    size_t n0 = 0;
    float *before = snapshot(B, &n0);
    const int64_t steps0 = dm_trainer_step_count(B);
    bytes[size - 5] ^= 0x10; /* a bit of the last tensor */
    write_bytes(bad, bytes, (size_t)size);
    dm_status s = dm_trainer_load(B, bad);
    CHECK(s == DM_ERR_FORMAT && strstr(dm_last_error(), "checksum"));
    printf("flipped bit: %s\n", dm_last_error());
    bytes[size - 5] ^= 0x10;
    /* two sign bits of one tensor, the top bits of its first two 8-byte words: version 1's
     * checksum (FNV-1a over words) let such a pair cancel */
    dm_st_file *sf = NULL;
    CHECK_OK(dm_st_parse(bytes, (size_t)size, &sf));
    const dm_st_tensor *last = NULL, *param = NULL; /* a parameter: its values may be negative */
    for (int i = 0; sf && i < dm_st_count(sf); i++) {
        const dm_st_tensor *t = dm_st_get(sf, i);
        if (!last || (uintptr_t)t->data > (uintptr_t)last->data) last = t;
        if (!param && !strstr(t->name, "exp_avg") && t->nbytes >= 16) param = t;
    }
    CHECK(last && param);
    if (last && param) {
        /* the data section ends the file: the last tensor's offset, and param's from it */
        const long off = size - (long)last->nbytes + (long)((const char *)param->data - (const char *)last->data);
        bytes[off + 7] ^= (char)0x80, bytes[off + 15] ^= (char)0x80;
        write_bytes(bad, bytes, (size_t)size);
        s = dm_trainer_load(B, bad);
        CHECK(s == DM_ERR_FORMAT && strstr(dm_last_error(), "checksum"));
        printf("two sign bits flipped: %s\n", dm_last_error());
        bytes[off + 7] ^= (char)0x80, bytes[off + 15] ^= (char)0x80;
    }
    dm_st_free(sf);
    write_bytes(bad, bytes, (size_t)size / 2);
    s = dm_trainer_load(B, bad);
    CHECK(s == DM_ERR_FORMAT || s == DM_ERR_IO);
    printf("truncated: %s\n", dm_last_error());
    size_t n1 = 0;
    float *after = snapshot(B, &n1);
    CHECK(before && after && n0 == n1 && memcmp(before, after, n0 * 4) == 0);
    CHECK(dm_trainer_step_count(B) == steps0);
    free(before);
    free(after);
    free(bytes);
    unlink(bad);

    /* another run (other dropout seed, other batch): refused, saying what differs */
    for (int q = 0; q < 2; q++) {
        dm_layer_config run = cfg;
        if (q) run.batch = 3;
        else run.seed = 4;
        CHECK_OK(dm_trainer_new(&C, &run, 3, NULL, &a));
        if (!C) continue;
        s = dm_trainer_load(C, path);
        CHECK(s == DM_ERR_INVALID_ARG && strstr(dm_last_error(), q ? "batch is 2" : "seed is 3"));
        printf("another run: %s\n", dm_last_error());
        CHECK(dm_trainer_step_count(C) == 0);
        dm_trainer_free(C);
        C = NULL;
    }
    /* another architecture: refused, saying what differs */
    for (int q = 0; q < 3; q++) {
        dm_layer_config other = cfg;
        if (q == 0) other.ffn = 48;
        else if (q == 1) other.norm = DM_NORM_PRE;
        else other.causal = 1;
        CHECK_OK(dm_trainer_new(&C, &other, 3, NULL, &a));
        if (!C) continue;
        s = dm_trainer_load(C, path);
        CHECK(s == DM_ERR_SHAPE && strstr(dm_last_error(), q == 0 ? "ffn is 32" : q == 1 ? "norm is post" : "causal is 0"));
        printf("other %s: %s\n", q == 0 ? "ffn" : q == 1 ? "norm" : "mask", dm_last_error());
        CHECK(dm_trainer_step_count(C) == 0);
        dm_trainer_free(C);
        C = NULL;
    }
    /* a checkpoint of the format before the layer variants (no "norm", no "causal" in its
     * metadata): a post-LN, bidirectional stack, and its checksum still holds */
    {
        dm_st_file *cf = NULL;
        dm_st_writer *w = NULL;
        CHECK_OK(dm_st_read(path, &cf));
        CHECK_OK(dm_st_writer_new(&w));
        static const char *const keys[] = {"format", "version", "layers", "hidden", "heads", "ffn", "act",
                                           "eps", "dropout", "seed", "batch", "seq", "run", "adamw",
                                           "adamw_total", "step", "checksum"};
        for (size_t k = 0; cf && w && k < sizeof keys / sizeof *keys; k++)
            CHECK_OK(dm_st_writer_set_metadata(w, keys[k], dm_st_metadata(cf, keys[k])));
        for (int k = 0; cf && w && k < dm_st_count(cf); k++) {
            const dm_st_tensor *t = dm_st_get(cf, k);
            CHECK_OK(dm_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
        }
        CHECK(cf && dm_st_metadata(cf, "norm") && !strcmp(dm_st_metadata(cf, "norm"), "post"));
        char old[sizeof path + 8];
        snprintf(old, sizeof old, "%s.old", path);
        if (w) CHECK_OK(dm_st_writer_write(w, old));
        CHECK_OK(dm_trainer_new(&C, &cfg, 3, NULL, &a));
        if (C) {
            CHECK_OK(dm_trainer_load(C, old));
            CHECK(dm_trainer_step_count(C) == 3);
            printf("a checkpoint without the variant keys: %s\n", dm_trainer_step_count(C) == 3 ? "loads" : "REFUSED");
            dm_trainer_free(C);
            C = NULL;
        }
        unlink(old);
        dm_st_writer_free(w);
        dm_st_free(cf);
    }
    CHECK_OK(dm_trainer_new(&C, &cfg, 2, NULL, &a));
    if (C) {
        s = dm_trainer_load(C, path);
        CHECK(s == DM_ERR_SHAPE && strstr(dm_last_error(), "layers"));
        /* parameters alone from a checkpoint with more layers: its first two */
        CHECK_OK(dm_trainer_load_params(C, path));
        float *p;
        dm_st_file *cf = NULL;
        CHECK_OK(dm_trainer_tensor(C, "encoder.layer.1.intermediate.dense.weight", &p, NULL, NULL));
        CHECK_OK(dm_st_read(path, &cf));
        const dm_st_tensor *t = cf ? dm_st_find(cf, "encoder.layer.1.intermediate.dense.weight") : NULL;
        CHECK(t && t->nbytes == 32 * 16 * 4 && memcmp(p, t->data, t->nbytes) == 0);
        dm_st_free(cf);
        CHECK(dm_trainer_step_count(C) == 0);
        dm_trainer_free(C);
        C = NULL;
    }
    /* parameters alone: a file with too few layers is refused, naming how many it has */
    dm_trainer *D = NULL;
    CHECK_OK(dm_trainer_new(&D, &cfg, 4, NULL, &a));
    if (D) {
        s = dm_trainer_load_params(D, path);
        CHECK(s == DM_ERR_NOT_FOUND && strstr(dm_last_error(), "holds 3 layer"));
        printf("too few layers: %s\n", dm_last_error());
        dm_trainer_free(D);
    }
out:
    unlink(path);
    dm_trainer_free(A);
    dm_trainer_free(B);
    dm_trainer_free(C);
}

/* Thousands of damaged copies of a checkpoint (bytes changed, truncations): loading one
 * never crashes, and the trainer ends as the intact file left it, whether the damage was
 * refused or was harmless (the checksum covers every value, so nothing else can load). */
static void test_ckpt_mutations(void) {
    const dm_layer_config cfg = tiny();
    char path[] = "/tmp/dmove_test_mut.XXXXXX";
    if (!temp_file(path)) return;
    char bad[sizeof path + 8];
    snprintf(bad, sizeof bad, "%s.bad", path);
    dm_trainer *A = NULL, *V = NULL;
    char *bytes = NULL, *m = NULL;
    float *want = NULL;
    CHECK_OK(dm_trainer_new(&A, &cfg, 1, NULL, NULL));
    CHECK_OK(dm_trainer_new(&V, &cfg, 1, NULL, NULL));
    if (!A || !V) goto out;
    CHECK_OK(dm_trainer_init_params(A, 9));
    batch_of(A, 1);
    CHECK_OK(dm_trainer_step(A, NULL));
    CHECK_OK(dm_trainer_save(A, path));
    CHECK_OK(dm_trainer_load(V, path));
    size_t nw = 0;
    want = snapshot(V, &nw);
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL && want != NULL);
    if (!fp || !want) goto out;
    fseek(fp, 0, SEEK_END);
    const long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    bytes = malloc((size_t)size);
    m = malloc((size_t)size);
    CHECK(bytes && m && fread(bytes, 1, (size_t)size, fp) == (size_t)size);
    fclose(fp);
    if (!bytes || !m) goto out;
    uint64_t r = 12345;
    int refused = 0, loaded = 0, kept = 1;
    for (int it = 0; it < 3000 && kept; it++) {
        memcpy(m, bytes, (size_t)size);
        size_t len = (size_t)size;
        r = dm_train_layer_seed(r, it, 1);
        if (it % 10 == 0) {
            len = (size_t)(r % (uint64_t)size); /* a truncation */
        } else {
            const int k = 1 + (int)(r >> 60) % 3;
            for (int q = 0; q < k; q++) {
                r = dm_train_layer_seed(r, q, 2);
                /* half the hits in the header, where the parser is */
                size_t at = (r & 1) ? (size_t)((r >> 8) % 4096 % (uint64_t)size) : (size_t)((r >> 8) % (uint64_t)size);
                m[at] = (char)(r >> 40);
            }
        }
        write_bytes(bad, m, len);
        if (dm_trainer_load(V, bad) == DM_OK) loaded++;
        else refused++;
        size_t n = 0;
        float *now = snapshot(V, &n);
        kept = now && n == nw && memcmp(now, want, n * 4) == 0 && dm_trainer_step_count(V) == 1;
        free(now);
    }
    CHECK(kept);
    printf("3000 damaged checkpoints: %d refused, %d harmless and loaded; the trainer %s\n", refused, loaded,
           kept ? "always as the intact file left it" : "CHANGED");
out:
    unlink(bad);
    unlink(path);
    free(bytes);
    free(m);
    free(want);
    dm_trainer_free(A);
    dm_trainer_free(V);
}

/* Pretrained parameters as a BERT checkpoint names them: under "bert.", LayerNorm's as
 * gamma and beta, one tensor in f64. */
static void test_load_bert_names(void) {
    const dm_layer_config cfg = tiny();
    char path[] = "/tmp/dmove_test_bert.XXXXXX";
    if (!temp_file(path)) return;
    dm_trainer *T = NULL;
    dm_st_writer *w = NULL;
    CHECK_OK(dm_trainer_new(&T, &cfg, 2, NULL, NULL));
    CHECK_OK(dm_st_writer_new(&w));
    if (!T || !w) goto out;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            char name[160], fname[200];
            snprintf(name, sizeof name, "encoder.layer.%d.%s", l, dm_param_names[k]);
            float *p;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_trainer_tensor(T, name, &p, &nd, sh));
            const int64_t n = nd == 1 ? sh[0] : sh[0] * sh[1];
            double *v = malloc((size_t)n * sizeof(double));
            float *f = malloc((size_t)n * sizeof(float));
            if (!v || !f) {
                free(v), free(f);
                continue;
            }
            for (int64_t e = 0; e < n; e++) v[e] = 0.001 * (double)(e % 97) + l + 0.01 * k;
            for (int64_t e = 0; e < n; e++) f[e] = (float)v[e];
            snprintf(fname, sizeof fname, "bert.%s", name);
            char *ln = strstr(fname, "LayerNorm.");
            if (ln) snprintf(ln + 10, sizeof fname - (size_t)(ln + 10 - fname), "%s", strstr(name, ".weight") ? "gamma" : "beta");
            const int f64 = k == 10; /* intermediate.dense.weight */
            CHECK_OK(dm_st_writer_add(w, fname, f64 ? DM_ST_F64 : DM_ST_F32, nd, sh, f64 ? (void *)v : (void *)f));
            free(v);
            free(f);
        }
    CHECK_OK(dm_st_writer_write(w, path));
    CHECK_OK(dm_trainer_load_params(T, path));
    int same = 1;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            char name[160];
            size_t n = 0;
            const float *p = param_of(T, l, k, "", &n, name);
            same &= p != NULL;
            for (size_t e = 0; p && e < n; e++) same &= p[e] == (float)(0.001 * (double)(e % 97) + l + 0.01 * k);
        }
    CHECK(same);
    printf("parameters under bert.encoder.layer.*, LayerNorm gamma/beta, one tensor f64: %s\n",
           same ? "loaded exactly" : "WRONG");
out:
    dm_st_writer_free(w);
    unlink(path);
    dm_trainer_free(T);
}

/* Values the checksum cannot vouch for (it is recomputed when an edited trainer saves):
 * a negative second moment, a NaN moment or parameter; a parameter file with an
 * infinity. Each refused naming the tensor, the trainer unchanged. */
static void test_bad_values(void) {
    const dm_layer_config cfg = tiny();
    char path[] = "/tmp/dmove_test_vals.XXXXXX";
    if (!temp_file(path)) return;
    dm_trainer *A = NULL, *V = NULL;
    CHECK_OK(dm_trainer_new(&A, &cfg, 1, NULL, NULL));
    CHECK_OK(dm_trainer_new(&V, &cfg, 1, NULL, NULL));
    if (A && V) {
        CHECK_OK(dm_trainer_init_params(A, 9));
        CHECK_OK(dm_trainer_init_params(V, 9));
        batch_of(A, 1);
        CHECK_OK(dm_trainer_step(A, NULL));
        static const char *const what[3] = {"encoder.layer.0.output.dense.weight.exp_avg_sq",
                                            "encoder.layer.0.output.dense.bias.exp_avg",
                                            "encoder.layer.0.attention.self.query.weight"};
        const float bad[3] = {-1e-3f, NAN, INFINITY};
        for (int k = 0; k < 3; k++) {
            float *p = NULL, keep;
            CHECK_OK(dm_trainer_tensor(A, what[k], &p, NULL, NULL));
            if (!p) continue;
            keep = p[1], p[1] = bad[k];
            CHECK_OK(dm_trainer_save(A, path));
            p[1] = keep;
            const int64_t step = dm_trainer_step_count(V);
            const dm_status st = dm_trainer_load(V, path);
            printf("  a checkpoint with %s[1] = %g: %s\n", what[k], (double)bad[k], dm_last_error());
            CHECK(st == DM_ERR_FORMAT && strstr(dm_last_error(), "not") && dm_trainer_step_count(V) == step);
            if (k == 2) { /* the same parameter file as --init reads: refused too */
                CHECK(dm_trainer_load_params(V, path) != DM_OK);
            }
        }
    }
    dm_trainer_free(A);
    dm_trainer_free(V);
    unlink(path);
}

int main(void) {
    test_bad_values();
    test_checkpoints();
    test_ckpt_mutations();
    test_load_bert_names();
    TEST_END();
}
