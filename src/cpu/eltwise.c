/* eltwise.c: the element-wise family, one row at a time: bias, residual add, attention
 * mask, dropout (Philox masks generated in place, never stored), activation, and their
 * backward; the fused schedule's rewrites (graph/rewrite.c): the activation with its
 * derivative (ACT_DERIV), the product (MUL) that replaces the activation's backward, and
 * the dropout backward that reads its mask off the forward output (DROPOUT_BWD_NZ); the
 * embedding gather (EMBED: the executor resolves the table row) and the cross-entropy's
 * backward given its logsumexp (XENT_BWD). Every loop is written for gcc's vectorizer. */
#include <float.h>

#include "core/philox.h"
#include "cpu/kernels.h"
#include "cpu/vmath.h"

/* The dropout's uniforms of this row, then y = keep ? x * scale : 0. Used forward and backward:
 * the same (seed, stream, element index) gives the same mask. */
static void dropout_row(const dm_row *rw, const float *x, float *y) {
    int64_t n = rw->cols;
    if (rw->op->p <= 0) {
        for (int64_t c = 0; c < n; c++) y[c] = x[c];
        return;
    }
    uint32_t thr = dm_dropout_threshold(rw->op->p);
    float scale = (float)(1.0 / (1.0 - rw->op->p));
    uint32_t *restrict w = rw->words;
    dm_dropout_uniforms(rw->seed, (uint32_t)rw->op->stream, (uint64_t)(rw->key * n), n, w);
    for (int64_t c = 0; c < n; c++) y[c] = w[c] >= thr ? x[c] * scale : 0.0f;
}

void dm_cpu_eltwise_row(const dm_row *rw) {
    int64_t n = rw->cols;
    const float *a = rw->in[0], *b = rw->in[1];
    float *y = rw->out[0];
    switch (rw->op->kind) {
    case DM_OP_BIAS_ADD:
    case DM_OP_ADD:
        for (int64_t c = 0; c < n; c++) y[c] = a[c] + b[c];
        break;
    case DM_OP_MASK_ADD: { /* as Hugging Face: scores + (1 - mask) * finfo.min */
        /* causal: the row's query j = r mod k (rows are (b, h, j), columns k); the keys
         * after it count as padding */
        int64_t keep = rw->op->causal ? rw->r % n + 1 : n;
        for (int64_t c = 0; c < keep; c++) y[c] = a[c] + (1.0f - b[c]) * -FLT_MAX;
        for (int64_t c = keep; c < n; c++) y[c] = a[c] + -FLT_MAX;
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD:
        dropout_row(rw, a, y);
        break;
    case DM_OP_DROPOUT_BWD_NZ: { /* in: dy, the forward output: kept where it is non-zero */
        float scale = rw->op->p > 0 ? (float)(1.0 / (1.0 - rw->op->p)) : 1.0f;
        for (int64_t c = 0; c < n; c++) y[c] = b[c] != 0.0f ? a[c] * scale : 0.0f;
        break;
    }
    case DM_OP_MUL:
        for (int64_t c = 0; c < n; c++) y[c] = a[c] * b[c];
        break;
    case DM_OP_EMBED: /* in: the table row idx[r] selects (NULL: none, zeros), idx */
        if (a)
            for (int64_t c = 0; c < n; c++) y[c] = a[c];
        else
            for (int64_t c = 0; c < n; c++) y[c] = 0.0f;
        break;
    case DM_OP_XENT_BWD: { /* in: logits, lse, label, dloss; dloss * (softmax - onehot) */
        const int64_t l = dm_index_row(*rw->in[2], n);
        if (l < 0) {
            for (int64_t c = 0; c < n; c++) y[c] = 0.0f;
            break;
        }
        const float lse = *b, d = *rw->in[3];
#pragma omp simd
        for (int64_t c = 0; c < n; c++) y[c] = d * dm_expf(a[c] - lse);
        y[l] -= d; /* y may be a (in place): element l was read above */
        break;
    }
    case DM_OP_ACT: {
        dm_act act = rw->op->act;
        if (act == DM_ACT_RELU) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_relu(a[c]);
        } else if (act == DM_ACT_TANH) {
            for (int64_t c = 0; c < n; c++) y[c] = dm_tanh(a[c]);
        } else if (act == DM_ACT_GELU_TANH) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_gelu_tanh(a[c]);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_gelu_erf(a[c]);
        }
        break;
    }
    case DM_OP_ACT_DERIV: { /* in: x; out: act(x), act'(x) from one evaluation */
        dm_act act = rw->op->act;
        float *d = rw->out[1];
        if (act == DM_ACT_RELU) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_relu2(a[c], &d[c]);
        } else if (act == DM_ACT_TANH) {
            for (int64_t c = 0; c < n; c++) y[c] = dm_tanh2(a[c], &d[c]);
        } else if (act == DM_ACT_GELU_TANH) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_gelu_tanh2(a[c], &d[c]);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = dm_gelu_erf2(a[c], &d[c]);
        }
        break;
    }
    case DM_OP_ACT_BWD: { /* in: dy, x */
        dm_act act = rw->op->act;
        if (act == DM_ACT_RELU) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = a[c] * dm_relu_grad(b[c]);
        } else if (act == DM_ACT_TANH) {
            for (int64_t c = 0; c < n; c++) y[c] = a[c] * dm_tanh_grad(b[c]);
        } else if (act == DM_ACT_GELU_TANH) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = a[c] * dm_gelu_tanh_grad(b[c]);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) y[c] = a[c] * dm_gelu_erf_grad(b[c]);
        }
        break;
    }
    default:
        break;
    }
}
