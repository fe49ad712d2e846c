/* norm.c: the normalization family, one row at a time: softmax (max-subtracted) and its
 * backward, LayerNorm (two-pass mean and variance) and its backward with the parameter
 * gradients accumulated as column sums, the plain column sum (bias gradients), and the
 * cross-entropy with its softmax fused (XENT: the loss and the logsumexp per row). The
 * embedding gradient (EMBED_BWD, a column sum by index) is no row kernel: exec.c. */
#include <math.h>

#include "cpu/kernels.h"
#include "cpu/vmath.h"

static void softmax_row(int64_t n, const float *restrict x, float *restrict y) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) {
        y[c] = dm_expf(x[c] - m);
        s += y[c];
    }
    float inv = 1.0f / s;
    for (int64_t c = 0; c < n; c++) y[c] *= inv;
}

/* dx = y * (dy - sum(dy * y)) */
static void softmax_bwd_row(int64_t n, const float *restrict dy, const float *restrict y,
                            float *restrict dx) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += dy[c] * y[c];
    for (int64_t c = 0; c < n; c++) dx[c] = y[c] * (dy[c] - s);
}

static void layernorm_row(int64_t n, double eps, const float *restrict x,
                          const float *restrict gm, const float *restrict bt,
                          float *restrict y, float *mean_out, float *rstd_out) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += x[c];
    float mean = s / (float)n;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < n; c++) {
        float d = x[c] - mean;
        v += d * d;
    }
    float rstd = (float)(1.0 / sqrt((double)(v / (float)n) + eps));
    for (int64_t c = 0; c < n; c++) y[c] = (x[c] - mean) * rstd * gm[c] + bt[c];
    *mean_out = mean;
    *rstd_out = rstd;
}

/* xh = (x - mean) * rstd; g = dy * gamma;
 * dx = rstd * (g - mean(g) - xh * mean(g * xh)); dgamma += dy * xh; dbeta += dy */
static void layernorm_bwd_row(int64_t n, const float *restrict dy, const float *restrict x,
                              float mean, float rstd, const float *restrict gm,
                              float *restrict dx, float *restrict dg, float *restrict db) {
    float sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t c = 0; c < n; c++) {
        float xh = (x[c] - mean) * rstd;
        float g = dy[c] * gm[c];
        sg += g;
        sgx += g * xh;
        dg[c] += dy[c] * xh;
        db[c] += dy[c];
    }
    float inv_n = 1.0f / (float)n;
    sg *= inv_n;
    sgx *= inv_n;
    for (int64_t c = 0; c < n; c++) {
        float xh = (x[c] - mean) * rstd;
        dx[c] = rstd * (dy[c] * gm[c] - sg - xh * sgx);
    }
}

/* Cross-entropy of one row of logits: lse = max + log(sum exp(x - max)) (two
 * reductions); loss = (max - x[label]) + log(sum), 0 for a label that selects no column
 * (-100). lse is kept in fp32: for logits of magnitude L the backward's probabilities
 * carry L * 2^-24 of relative error (BERT's logits: tens). */
static void xent_row(int64_t n, const float *restrict x, float label, float *loss, float *lse_out) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += dm_exp_neg(x[c] - m);
    const float ls = logf(s);
    const int64_t l = dm_index_row(label, n);
    *lse_out = m + ls;
    *loss = l >= 0 ? (m - x[l]) + ls : 0.0f; /* not lse - x[l]: exact when x[l] is the max */
}

void dm_cpu_norm_row(const dm_row *rw) {
    int64_t n = rw->cols;
    switch (rw->op->kind) {
    case DM_OP_SOFTMAX:
        softmax_row(n, rw->in[0], rw->out[0]);
        break;
    case DM_OP_SOFTMAX_BWD:
        softmax_bwd_row(n, rw->in[0], rw->in[1], rw->out[0]);
        break;
    case DM_OP_LAYERNORM:
        layernorm_row(n, rw->op->eps, rw->in[0], rw->in[1], rw->in[2], rw->out[0], rw->out[1],
                      rw->out[2]);
        break;
    case DM_OP_LAYERNORM_BWD:
        layernorm_bwd_row(n, rw->in[0], rw->in[1], *rw->in[2], *rw->in[3], rw->in[4],
                          rw->out[0], rw->out[1], rw->out[2]);
        break;
    case DM_OP_XENT:
        xent_row(n, rw->in[0], *rw->in[1], rw->out[0], rw->out[1]);
        break;
    case DM_OP_COLSUM: {
        const float *restrict x = rw->in[0];
        float *restrict acc = rw->out[0];
        for (int64_t c = 0; c < n; c++) acc[c] += x[c];
        break;
    }
    default:
        break;
    }
}
