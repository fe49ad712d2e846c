/* teacher.c: the teacher task of a training run (dm_teacher of dmove_tools.h): a second
 * stack with its own random weights (BERT's initialisation times a scale, dropout off)
 * turns fresh random inputs N(0, 1), with random padding, into each step's targets. Its
 * forward pass runs on the trainer's device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "core/status.h"
#include "dmove_tools.h"
#include "graph/encoder.h"

struct dm_teacher {
    dm_trainer *T;
    dm_layer_config cfg;
    int part, parts;     /* the batches are this part of batches of b * parts (1: whole) */
    float *x, *mask, *y; /* its hidden_states, attention_mask and output */
};

/* The teacher task's inputs of step s: N(0, 1) from Philox (the seed, stream 2001,
 * counter s * B*j*i + element, B = b * parts the global batch), and a padding mask keeping
 * j - (w mod (j/4 + 1)) tokens of each sequence but the global batch's first (whole);
 * sequences q0 .. q0 + b - 1 of it. */
static void fill_teacher_inputs(uint64_t seed, int64_t step, int64_t b, int64_t parts, int64_t q0, int64_t j,
                                int64_t i, float *x, float *mask) {
    const int64_t n = b * j * i;
    const uint64_t base = (uint64_t)step * (uint64_t)(n * parts) + (uint64_t)(q0 * j * i);
#pragma omp parallel for schedule(static)
    for (int64_t e0 = 0; e0 < n; e0 += 2048) {
        uint32_t w[2048];
        const int64_t m = n - e0 < 2048 ? n - e0 : 2048;
        dm_philox_words(seed, 2001u, base + (uint64_t)e0, (m + 1) & ~(int64_t)1, w);
        for (int64_t k = 0; k < m; k += 2) {
            double u1 = ((double)w[k] + 1.0) / 4294967297.0, u2 = (double)w[k + 1] / 4294967296.0;
            double r = sqrt(-2.0 * log(u1));
            x[e0 + k] = (float)(r * cos(6.283185307179586 * u2));
            if (k + 1 < m) x[e0 + k + 1] = (float)(r * sin(6.283185307179586 * u2));
        }
    }
    for (int64_t q = 0; q < b; q++) {
        uint32_t w;
        dm_philox_words(seed, 2002u, (uint64_t)step * (uint64_t)(b * parts) + (uint64_t)(q0 + q), 1, &w);
        int64_t keep = q0 + q == 0 ? j : j - (int64_t)(w % (uint32_t)(j / 4 + 1));
        for (int64_t t = 0; t < j; t++) mask[q * j + t] = t < keep ? 1.0f : 0.0f;
    }
}

/* Its weights (2-D parameters) times scale. */
static dm_status scale_weights(dm_trainer *T, int layers, double scale) {
    char name[160];
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            float *p;
            int nd;
            int64_t sh[4];
            snprintf(name, sizeof name, "encoder.layer.%d.%s", l, dm_param_names[k]);
            DM_TRY(dm_trainer_tensor(T, name, &p, &nd, sh));
            if (nd == 2)
                for (int64_t e = 0; e < sh[0] * sh[1]; e++) p[e] *= (float)scale;
        }
    return DM_OK;
}

static float *tensor(dm_trainer *t, const char *name) {
    float *p = NULL;
    return dm_trainer_tensor(t, name, &p, NULL, NULL) == DM_OK ? p : NULL;
}

dm_status dm_teacher_new(dm_teacher **out, const dm_layer_config *cfg, int layers, const dm_layer_options *opt,
                         double scale) {
    if (out) *out = NULL;
    if (!out || !cfg || !opt) return dm_fail(DM_ERR_INVALID_ARG, "dm_teacher_new: NULL argument");
    dm_teacher *t = calloc(1, sizeof *t);
    if (!t) return dm_fail(DM_ERR_OOM, "out of memory");
    t->cfg = *cfg;
    t->parts = 1;
    dm_layer_config tc = *cfg;
    tc.dropout = 0.0;
    /* on the trainer's device: its forward pass makes each step's targets (with the
     * generated kernels rather than auto's per-group timing of both, at creation) */
    dm_layer_options to = {.threads = opt->threads, .forward_only = 1, .device = opt->device, .dtype = opt->dtype,
                           .rows = opt->rows == DM_ROWS_AUTO ? DM_ROWS_GEN : opt->rows, .streams = opt->streams};
    dm_status s = dm_trainer_new(&t->T, &tc, layers, &to, NULL);
    if (s == DM_OK) s = dm_trainer_init_params(t->T, cfg->seed ^ 0x7465616368657200ull /* "teacher" */);
    if (s == DM_OK) s = scale_weights(t->T, layers, scale);
    if (s == DM_OK && (!(t->x = tensor(t->T, "hidden_states")) || !(t->mask = tensor(t->T, "attention_mask")) ||
                       !(t->y = tensor(t->T, "output"))))
        s = dm_fail_context(DM_ERR_INTERNAL, "%s", ""); /* the message of the lookup, marked internal */
    if (s != DM_OK) {
        dm_teacher_free(t);
        return s;
    }
    *out = t;
    return DM_OK;
}

void dm_teacher_free(dm_teacher *t) {
    if (!t) return;
    dm_trainer_free(t->T);
    free(t);
}

dm_status dm_teacher_batch(dm_teacher *t, int64_t step, float *x, float *y, float *mask) {
    if (!t || !x || !y || !mask) return dm_fail(DM_ERR_INVALID_ARG, "dm_teacher_batch: NULL argument");
    if (step < 1) return dm_fail(DM_ERR_INVALID_ARG, "dm_teacher_batch: step %lld: steps count from 1", (long long)step);
    const int64_t b = t->cfg.batch, j = t->cfg.seq, I = t->cfg.hidden;
    fill_teacher_inputs(t->cfg.seed, step, b, t->parts, (int64_t)t->part * b, j, I, t->x, t->mask);
    double tl;
    DM_TRY(dm_trainer_forward(t->T, &tl));
    memcpy(x, t->x, (size_t)(b * j * I) * sizeof(float));
    memcpy(y, t->y, (size_t)(b * j * I) * sizeof(float));
    memcpy(mask, t->mask, (size_t)(b * j) * sizeof(float));
    return DM_OK;
}

dm_status dm_teacher_set_part(dm_teacher *t, int part, int parts) {
    if (!t) return dm_fail(DM_ERR_INVALID_ARG, "dm_teacher_set_part: NULL teacher");
    if (parts < 1 || part < 0 || part >= parts)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_teacher_set_part: part %d of %d", part, parts);
    /* Box-Muller takes words in pairs: a part must start on an even element */
    if (parts > 1 && (t->cfg.seq * t->cfg.hidden) % 2)
        return dm_fail(DM_ERR_UNSUPPORTED, "the teacher task in parts needs j * i even (j %lld, i %lld)",
                       (long long)t->cfg.seq, (long long)t->cfg.hidden);
    t->part = part;
    t->parts = parts;
    return DM_OK;
}
