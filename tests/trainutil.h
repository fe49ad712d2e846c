/* trainutil.h: what the trainer's tests (test_train.c, test_checkpoint.c) share: a tiny
 * layer, step s's batch from s alone, every parameter and moment as one snapshot, and a
 * temporary file. */
#ifndef DM_TRAINUTIL_H
#define DM_TRAINUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/philox.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "testutil.h"
#include "train/train.h"

/* Makes the file named by the template path (ending in XXXXXX); 0 if it cannot. */
static inline int temp_file(char *path) {
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

static inline dm_layer_config tiny(void) {
    dm_layer_config c;
    dm_layer_config_default(&c);
    c.batch = 2, c.seq = 6, c.hidden = 16, c.heads = 2, c.ffn = 32, c.dropout = 0.1, c.seed = 3;
    return c;
}

/* Step s's inputs and targets, from s alone (what a data loader at position s gives). */
static inline void batch_of(dm_trainer *T, int64_t s) {
    float *x, *t, *m;
    int64_t sh[4];
    dm_trainer_tensor(T, "hidden_states", &x, NULL, sh);
    dm_trainer_tensor(T, "target", &t, NULL, NULL);
    dm_trainer_tensor(T, "attention_mask", &m, NULL, NULL);
    const int64_t n = sh[0] * sh[1] * sh[2];
    uint32_t w[2];
    for (int64_t e = 0; e < n; e++) {
        dm_philox_words(11, 5, (uint64_t)(s * n + e) * 2, 2, w);
        x[e] = (float)((double)w[0] / 4294967296.0 * 2 - 1);
        t[e] = (float)((double)w[1] / 4294967296.0 * 2 - 1);
    }
    for (int64_t k = 0; k < sh[0] * sh[1]; k++) m[k] = (k % sh[1]) < sh[1] - (s + k / sh[1]) % 3 ? 1.0f : 0.0f;
}

/* Layer l's parameter k with `suffix` ("", ".grad", ".exp_avg", ".exp_avg_sq"): its data
 * and elements (*m), its name in `name` (160 bytes); NULL if the trainer has none. */
static inline float *param_of(dm_trainer *T, int l, int k, const char *suffix, size_t *m, char *name) {
    snprintf(name, 160, "encoder.layer.%d.%s%s", l, dm_param_names[k], suffix);
    float *p;
    int nd;
    int64_t sh[4];
    if (dm_trainer_tensor(T, name, &p, &nd, sh) != DM_OK) return NULL;
    *m = (size_t)(nd == 1 ? sh[0] : sh[0] * sh[1]);
    return p;
}

static const char *const k_state[3] = {"", ".exp_avg", ".exp_avg_sq"};

/* Every parameter and moment of T, concatenated (a snapshot to compare). */
static inline float *snapshot(dm_trainer *T, size_t *count) {
    size_t n = 0, cap = 0;
    float *all = NULL;
    for (int l = 0; l < dm_trainer_layers(T); l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++)
            for (int q = 0; q < 3; q++) {
                char name[160];
                size_t m;
                const float *p = param_of(T, l, k, k_state[q], &m, name);
                if (!p) continue;
                if (n + m > cap) {
                    cap = (n + m) * 2;
                    all = realloc(all, cap * sizeof(float));
                    if (!all) return NULL;
                }
                memcpy(all + n, p, m * sizeof(float));
                n += m;
            }
    *count = n;
    return all;
}

static inline int same_state(dm_trainer *A, dm_trainer *B) {
    size_t na = 0, nb = 0;
    float *a = snapshot(A, &na), *b = snapshot(B, &nb);
    int same = a && b && na == nb && memcmp(a, b, na * sizeof(float)) == 0;
    free(a);
    free(b);
    return same;
}

#endif
