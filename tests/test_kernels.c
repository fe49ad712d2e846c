/* test_kernels.c: every element-wise and normalization row kernel against its naive
 * double-precision reference (src/cpu/ref.c), on odd and even row lengths (vector
 * remainders, dropout blocks that start mid-Philox-block), all activations; then the
 * activations elementwise over [-12, 12] (tails, underflow), and the fused schedule's
 * ACT_DERIV + MUL and DROPOUT_BWD_NZ against the unfused ACT, ACT_BWD and DROPOUT_BWD:
 * equal bit for bit. */
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
    if (kind == DM_OP_DROPOUT_BWD_NZ) /* the forward output: dropped elements are zero */
        for (int64_t e = 0; e < R * C; e += 3) in[1][e] = 0.0f;
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
        rw.r = rw.key = r;
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
                   kind == DM_OP_ACT || kind == DM_OP_ACT_BWD || kind == DM_OP_ACT_DERIV
                       ? dm_act_name(act) : "",
                   (long long)R, (long long)C, s, e, ok ? "ok" : "FAIL");
        free(out[s]);
        free(ref[s]);
    }
    for (int s = 0; s < nin; s++) free(in[s]);
    free(words);
}

/* One row of n elements through kernel `kind`. */
static void row1(dm_op_kind kind, dm_act act, int64_t n, const float *a, const float *b, float *y,
                 float *y2) {
    dm_op op = {.kind = kind, .rows = 1, .cols = n, .act = act};
    dm_row rw = {.op = &op, .cols = n, .in = {a, b}, .out = {y, y2}};
    dm_cpu_row(&rw);
}

/* Each activation and its derivative, elementwise over [-12, 12] (a fine grid, the tails
 * where Phi and phi underflow): |got - ref| <= 4e-6 |ref| + 1e-7. Then the fused
 * schedule's kernels against the unfused ones: ACT_DERIV's act(x) == ACT's, and
 * MUL(dy, act'(x)) == ACT_BWD(dy, x), bit for bit. */
static void act_sweep(void) {
    const int64_t n = 24001;
    float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
    float *ry = malloc(sizeof(float) * n), *rd = malloc(sizeof(float) * n);
    float *ya = malloc(sizeof(float) * n), *dxb = malloc(sizeof(float) * n), *dxm = malloc(sizeof(float) * n);
    uint64_t seed = 99;
    for (int64_t e = 0; e < n; e++) {
        x[e] = (float)(-12.0 + 24.0 * (double)e / (double)(n - 1));
        dy[e] = frand(&seed);
    }
    for (int a = 0; a <= DM_ACT_TANH; a++) {
        dm_op op = {.kind = DM_OP_ACT_DERIV, .nin = 1, .nout = 2, .rows = 1, .cols = n, .act = (dm_act)a};
        dm_ref_op(&op, 0, 1, (const float *const[]){x}, (float *const[]){ry, rd});
        row1(DM_OP_ACT_DERIV, (dm_act)a, n, x, NULL, y, d);
        row1(DM_OP_ACT, (dm_act)a, n, x, NULL, ya, NULL);
        row1(DM_OP_ACT_BWD, (dm_act)a, n, dy, x, dxb, NULL);
        row1(DM_OP_MUL, (dm_act)a, n, dy, d, dxm, NULL);
        double wy = 0, wd = 0;
        int bad = 0, same = 1;
        for (int64_t e = 0; e < n; e++) {
            double ey = fabs((double)y[e] - ry[e]), ed = fabs((double)d[e] - rd[e]);
            bad += !(ey <= 4e-6 * fabs(ry[e]) + 1e-7) || !(ed <= 4e-6 * fabs(rd[e]) + 1e-7);
            if (fabs(ry[e]) > 1e-30 && ey / fabs(ry[e]) > wy) wy = ey / fabs(ry[e]);
            if (fabs(rd[e]) > 1e-3 && ed / fabs(rd[e]) > wd) wd = ed / fabs(rd[e]);
            same &= memcmp(&y[e], &ya[e], 4) == 0 && memcmp(&dxb[e], &dxm[e], 4) == 0;
        }
        CHECK(bad == 0);
        CHECK(same);
        printf("  %-9s on [-12, 12]: act max rel.err %.2e, act' %.2e (|act'| > 1e-3), %d out of "
               "bounds; fused == unfused kernels: %s\n", dm_act_name((dm_act)a), wy, wd, bad,
               same ? "bit for bit" : "DIFFER");
    }
    free(x), free(dy), free(y), free(d), free(ry), free(rd), free(ya), free(dxb), free(dxm);
}

/* DROPOUT_BWD_NZ reads the mask off the forward output: wherever the dropout's input is
 * non-zero it equals DROPOUT_BWD (which regenerates the mask) bit for bit. */
static void dropout_nz_vs_philox(int64_t n, double p) {
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n);
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    uint32_t *words = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t seed = 5;
    for (int64_t e = 0; e < n; e++) {
        x[e] = frand(&seed);
        x[e] = x[e] == 0.0f ? 1.0f : x[e];
        dy[e] = frand(&seed);
    }
    dm_op op = {.kind = DM_OP_DROPOUT, .rows = 1, .cols = n, .p = p, .stream = 3};
    dm_row rw = {.op = &op, .cols = n, .seed = 11, .words = words, .in = {x}, .out = {y}};
    dm_cpu_row(&rw);
    op.kind = DM_OP_DROPOUT_BWD;
    rw.in[0] = dy;
    rw.out[0] = a;
    dm_cpu_row(&rw);
    op.kind = DM_OP_DROPOUT_BWD_NZ;
    rw.in[1] = y;
    rw.out[0] = b;
    dm_cpu_row(&rw);
    int same = memcmp(a, b, sizeof(float) * (size_t)n) == 0;
    CHECK(same);
    printf("  dropout_bwd_nz vs dropout_bwd, p %.1f, %lld elements: %s\n", p, (long long)n,
           same ? "bit for bit" : "DIFFER");
    free(x), free(y), free(dy), free(a), free(b), free(words);
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
            run(DM_OP_DROPOUT_BWD_NZ, 2, 1, R, C, 0, pp);
        }
        for (int a = 0; a <= DM_ACT_TANH; a++) {
            run(DM_OP_ACT, 1, 1, R, C, (dm_act)a, 0);
            run(DM_OP_ACT_BWD, 2, 1, R, C, (dm_act)a, 0);
            run(DM_OP_ACT_DERIV, 1, 2, R, C, (dm_act)a, 0);
        }
        run(DM_OP_MUL, 2, 1, R, C, 0, 0);
        if (C > 1) run(DM_OP_SOFTMAX, 1, 1, R, C, 0, 0);
        run(DM_OP_SOFTMAX_BWD, 2, 1, R, C, 0, 0);
        if (C > 1) run(DM_OP_LAYERNORM, 3, 3, R, C, 0, 0);
        if (C > 1) run(DM_OP_LAYERNORM_BWD, 5, 3, R, C, 0, 0);
        run(DM_OP_COLSUM, 1, 1, R, C, 0, 0);
    }
    act_sweep();
    dropout_nz_vs_philox(10007, 0.1);
    dropout_nz_vs_philox(4096, 0.5);
    TEST_END();
}
