/* layerutil.h: what the whole-layer tests share: deterministic inputs and parameters
 * (padding in the mask, non-trivial biases and LayerNorm parameters), and the worst
 * relative error over the output and every gradient of two layers. */
#ifndef DM_LAYERUTIL_H
#define DM_LAYERUTIL_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dmove.h"
#include "testutil.h"

static inline void fill_inputs(dm_layer *L, uint64_t seed) {
    CHECK_OK(dm_layer_init_params(L, seed));
    const char *names[3] = {"hidden_states", "grad_output", "attention_mask"};
    for (int k = 0; k < 3; k++) {
        float *p;
        int nd;
        int64_t sh[4];
        if (k == 1 && dm_layer_tensor(L, names[k], &p, &nd, sh) == DM_ERR_NOT_FOUND)
            continue; /* a forward-only layer has no output gradient */
        CHECK_OK(dm_layer_tensor(L, names[k], &p, &nd, sh));
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= sh[d];
        for (int64_t i = 0; i < n; i++)
            p[i] = k < 2 ? (float)sin(0.37 * (double)i + k) : (i % sh[1] < sh[1] - 1 - (i / sh[1]) % 3);
    }
    /* non-trivial LayerNorm parameters and biases */
    for (int q = 0; q < dm_layer_num_params(L); q++) {
        float *p;
        int nd;
        int64_t sh[4];
        CHECK_OK(dm_layer_tensor(L, dm_layer_param_name(L, q), &p, &nd, sh));
        if (nd == 1)
            for (int64_t i = 0; i < sh[0]; i++) p[i] += 0.1f * (float)cos(1.3 * (double)i + q);
    }
}

/* zero_key_bias: the key bias gradient is zero in exact arithmetic (softmax is invariant
 * to a shift of a row's scores, which is what a key bias adds), so its float value is
 * rounding noise: when the two runs may round differently (other GEMM blockings), its
 * error is taken relative to 1e-3 (1: the other gradients' norms at the tests' tiny
 * sizes are >= 1e-2) or (2) relative to the norm of B's query bias gradient, a gradient
 * of its shape and scale at any size. */
static inline double compare_all_ex(dm_layer *A, dm_layer *B, int print, int zero_key_bias) {
    const char *fixed[2] = {"output", "grad_hidden_states"};
    double worst = 0, key_scale = 1e-3;
    if (zero_key_bias == 2) {
        float *q;
        int nd;
        int64_t sh[4];
        CHECK_OK(dm_layer_tensor(B, "attention.self.query.bias.grad", &q, &nd, sh));
        double qn = 0;
        for (int64_t i = 0; i < sh[0]; i++) qn += (double)q[i] * (double)q[i];
        key_scale = sqrt(qn);
    }
    for (int k = 0; k < 2 + dm_layer_num_params(A); k++) {
        char name[128];
        if (k < 2) snprintf(name, sizeof name, "%s", fixed[k]);
        else snprintf(name, sizeof name, "%s.grad", dm_layer_param_name(A, k - 2));
        float *a, *b;
        int nd;
        int64_t sh[4];
        CHECK_OK(dm_layer_tensor(A, name, &a, &nd, sh));
        CHECK_OK(dm_layer_tensor(B, name, &b, &nd, sh));
        size_t n = 1;
        for (int d = 0; d < nd; d++) n *= (size_t)sh[d];
        double e = rel_err(a, b, n);
        if (zero_key_bias && !strcmp(name, "attention.self.key.bias.grad")) {
            double d = 0;
            for (size_t q = 0; q < n; q++) d += ((double)a[q] - (double)b[q]) * ((double)a[q] - (double)b[q]);
            e = sqrt(d) / key_scale;
        }
        if (print) printf("  %-42s rel.err %.2e\n", name, e);
        if (!(e <= worst)) worst = e; /* NaN counts */
    }
    return worst;
}

static inline double compare_all(dm_layer *A, dm_layer *B, int print) {
    return compare_all_ex(A, B, print, 0);
}

#endif
