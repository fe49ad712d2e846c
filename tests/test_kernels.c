/* test_kernels.c: every element-wise and normalization row kernel against its naive
 * double-precision reference (src/cpu/ref.c), on odd and even row lengths (vector
 * remainders, dropout blocks that start mid-Philox-block), all activations. */
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "dmove.h"
#include "testutil.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static int64_t numel_of(dm_arg_kind k, int64_t R, int64_t C, int64_t G) {
    switch (k) {
    case DM_ARG_COLVEC: case DM_ARG_COLACC: return C;
    case DM_ARG_ROWSCALAR: return R;
    case DM_ARG_GROUPED: return G * C;
    default: return R * C;
    }
}

static void run(dm_op_kind kind, int nin, int nout, int64_t R, int64_t C, dm_act act, double p) {
    dm_op op = {.kind = kind, .nin = nin, .nout = nout, .rows = R, .cols = C, .act = act,
                .p = p, .stream = 2, .eps = 1e-5};
    int64_t G = R % 3 == 0 ? 3 : 1;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(R * 131 + C);
    float *in[DM_MAX_IN], *out[DM_MAX_OUT], *ref[DM_MAX_OUT];
    for (int s = 0; s < nin; s++) {
        int64_t n = numel_of(dm_arg_in(kind, s), R, C, G);
        in[s] = malloc(sizeof(float) * (size_t)n);
        for (int64_t e = 0; e < n; e++) in[s][e] = frand(&seed);
    }
    if (kind == DM_OP_MASK_ADD)
        for (int64_t e = 0; e < G * C; e++) in[1][e] = (float)(e % 4 != 3);
    if (kind == DM_OP_LAYERNORM_BWD) { /* consistent statistics for x */
        for (int64_t r = 0; r < R; r++) {
            double m = 0, v = 0;
            for (int64_t c = 0; c < C; c++) m += in[1][r * C + c];
            m /= (double)C;
            for (int64_t c = 0; c < C; c++) v += (in[1][r * C + c] - m) * (in[1][r * C + c] - m);
            in[2][r] = (float)m;
            in[3][r] = (float)(1 / sqrt(v / (double)C + 1e-5));
        }
    }
    if (kind == DM_OP_SOFTMAX_BWD) /* y must be a softmax output for a meaningful check */
        for (int64_t r = 0; r < R; r++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++) s += (in[1][r * C + c] = fabsf(in[1][r * C + c]));
            for (int64_t c = 0; c < C; c++) in[1][r * C + c] /= (float)s;
        }
    for (int s = 0; s < nout; s++) {
        int64_t n = numel_of(dm_arg_out(kind, s), R, C, G);
        out[s] = calloc((size_t)n, sizeof(float));
        ref[s] = calloc((size_t)n, sizeof(float));
    }
    uint32_t *words = malloc(sizeof(uint32_t) * (size_t)C);
    dm_row rw = {.op = &op, .cols = C, .seed = 77, .words = words};
    for (int64_t r = 0; r < R; r++) {
        rw.r = r;
        for (int s = 0; s < nin; s++) {
            dm_arg_kind k = dm_arg_in(kind, s);
            rw.in[s] = k == DM_ARG_FULL ? in[s] + r * C : k == DM_ARG_COLVEC ? in[s]
                     : k == DM_ARG_ROWSCALAR ? in[s] + r : in[s] + (r / (R / G)) * C;
        }
        for (int s = 0; s < nout; s++) {
            dm_arg_kind k = dm_arg_out(kind, s);
            rw.out[s] = k == DM_ARG_FULL ? out[s] + r * C : k == DM_ARG_ROWSCALAR ? out[s] + r : out[s];
        }
        dm_cpu_row(&rw);
    }
    dm_ref_op(&op, 77, G, (const float *const *)in, ref);
    for (int s = 0; s < nout; s++) {
        int64_t n = numel_of(dm_arg_out(kind, s), R, C, G);
        double e = rel_err(out[s], ref[s], (size_t)n);
        double tol = 2e-6;
        int ok = e < tol;
        CHECK(ok);
        if (!ok || (R == 6 && C == 33))
            printf("  %-14s %-9s rows %3lld cols %4lld out %d: rel.err %.2e %s\n", dm_op_kind_name(kind),
                   kind == DM_OP_ACT || kind == DM_OP_ACT_BWD ? dm_act_name(act) : "",
                   (long long)R, (long long)C, s, e, ok ? "ok" : "FAIL");
        free(out[s]);
        free(ref[s]);
    }
    for (int s = 0; s < nin; s++) free(in[s]);
    free(words);
}

int main(void) {
    const int64_t shapes[][2] = {{1, 1}, {6, 33}, {5, 7}, {12, 128}, {3, 768}, {2, 1031}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t R = shapes[k][0], C = shapes[k][1];
        run(DM_OP_BIAS_ADD, 2, 1, R, C, 0, 0);
        run(DM_OP_ADD, 2, 1, R, C, 0, 0);
        run(DM_OP_MASK_ADD, 2, 1, R, C, 0, 0);
        for (int p = 0; p < 3; p++) {
            double pp = p == 0 ? 0.0 : p == 1 ? 0.1 : 0.5;
            run(DM_OP_DROPOUT, 1, 1, R, C, 0, pp);
            run(DM_OP_DROPOUT_BWD, 1, 1, R, C, 0, pp);
        }
        for (int a = 0; a < 3; a++) {
            run(DM_OP_ACT, 1, 1, R, C, (dm_act)a, 0);
            run(DM_OP_ACT_BWD, 2, 1, R, C, (dm_act)a, 0);
        }
        if (C > 1) run(DM_OP_SOFTMAX, 1, 1, R, C, 0, 0);
        run(DM_OP_SOFTMAX_BWD, 2, 1, R, C, 0, 0);
        if (C > 1) run(DM_OP_LAYERNORM, 3, 3, R, C, 0, 0);
        if (C > 1) run(DM_OP_LAYERNORM_BWD, 5, 3, R, C, 0, 0);
        run(DM_OP_COLSUM, 1, 1, R, C, 0, 0);
    }
    TEST_END();
}
