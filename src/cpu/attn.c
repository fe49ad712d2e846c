/* attn.c: attention over packed sequences of their own lengths (ops.def's ATTN and
 * ATTN_BWD, issue 25's unpadded batches). The threads take (sequence, head) items, the
 * longest first; each item's GEMMs run single-threaded on the direct kernel (BLAS where it
 * does not run) over that sequence's rows alone, its scores and their gradients in the
 * thread's buffer, so no work or memory traffic goes to padding. The dropout's Philox keys
 * are the padded layer's element indices (b, h, j, k): the same masks as the padded path. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "core/status.h"
#include "cpu/attn.h"
#include "cpu/contract.h"
#include "cpu/stream.h"
#include "cpu/vmath.h"
#include "plan/live.h"

int64_t dm_cpu_attn_work_floats(int64_t J) {
    /* per thread: the direct kernel's packing buffer (first: 64-byte aligned), two J x J
     * blocks (the dropped probabilities; the forward's scores, the backward's score
     * gradients) and J random words, rounded up to whole 64-byte lines */
    return (DM_GEMM_DIRECT_PACK_FLOATS + 2 * J * J + J + 15) / 16 * 16;
}

/* C = alpha op(A) op(B), single-threaded */
static void mm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int64_t lda, const float *B,
               int64_t ldb, float *C, int64_t ldc, float *pack) {
    if (dm_gemm_direct_available()) {
        dm_sgemm_direct(ta, tb, m, n, k, alpha, A, (int)lda, B, (int)ldb, C, (int)ldc, pack);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A,
                (int)lda, B, (int)ldb, 0.0f, C, (int)ldc);
}

/* Row j of item (s, h)'s dropped probabilities: d[c] = keep ? p[c] / (1 - prob) : 0 for
 * c < n (the keys it sees); the mask's uniforms at the padded index. */
static void drop_row(const dm_attn_dims *a, uint64_t seed, int64_t s, int64_t h, int64_t j, const float *p, float *d,
                     int64_t n, uint32_t *w) {
    if (a->p <= 0) {
        memcpy(d, p, sizeof(float) * (size_t)n);
        return;
    }
    const uint32_t thr = dm_dropout_threshold(a->p);
    const float scale = (float)(1.0 / (1.0 - a->p));
    dm_dropout_uniforms(seed, (uint32_t)a->stream, (uint64_t)(((s * a->H + h) * a->J + j) * a->J), n, w);
    for (int64_t c = 0; c < n; c++) d[c] = w[c] >= thr ? p[c] * scale : 0.0f;
}

/* Items (s, h) in the order the threads take them: the longest sequences first, so that
 * the dynamic schedule ends with short ones. */
static int64_t *item_order(const dm_attn_dims *a, const int64_t *off) {
    int64_t *ord = malloc(sizeof(int64_t) * (size_t)a->B);
    if (!ord) return NULL;
    for (int64_t s = 0; s < a->B; s++) ord[s] = s;
    for (int64_t x = 1; x < a->B; x++) /* insertion sort by length, descending, stable */
        for (int64_t y = x; y > 0 && off[ord[y] + 1] - off[ord[y]] > off[ord[y - 1] + 1] - off[ord[y - 1]]; y--) {
            int64_t t = ord[y];
            ord[y] = ord[y - 1];
            ord[y - 1] = t;
        }
    return ord;
}

/* One item of the forward pass. */
static void attn_item(const dm_attn_dims *a, const dm_attn_io *io, uint64_t seed, int64_t s, int64_t h, int64_t o,
                      int64_t L, float *work) {
    const int64_t J = a->J, P = a->P;
    float *pack = work, *d = work + DM_GEMM_DIRECT_PACK_FLOATS, *sc = d + J * J;
    uint32_t *w = (uint32_t *)(d + 2 * J * J);
    float *pr = io->probs + (s * a->H + h) * J * J; /* row j at pr + j * J */
    const float *q = io->q + o * a->ldq + h * P, *k = io->k + o * a->ldq + h * P, *v = io->v + o * a->ldq + h * P;
    /* the scores in the thread's buffer; each row's probabilities streamed to memory (read
     * again only by the backward) */
    mm(0, 1, (int)L, (int)L, (int)P, a->alpha, q, a->ldq, k, a->ldq, sc, L, pack);
    const float *km = io->mask ? io->mask + s * J : NULL;
    for (int64_t j = 0; j < L; j++) {
        float *x = sc + j * L;
        for (int64_t c = 0; km && c < L; c++) x[c] += (1.0f - km[c]) * -FLT_MAX; /* as MASK_ADD */
        const int64_t n = a->causal ? j + 1 : L;
        float m = -INFINITY, sum = 0; /* as the padded layer's softmax row (norm.c) */
#pragma omp simd reduction(max : m)
        for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < n; c++) {
            x[c] = dm_expf(x[c] - m);
            sum += x[c];
        }
        const float inv = 1.0f / sum;
        for (int64_t c = 0; c < n; c++) x[c] *= inv;
        for (int64_t c = n; c < L; c++) x[c] = 0.0f;
        dm_stream_row(pr + j * J, x, L);
        drop_row(a, seed, s, h, j, x, d + j * L, n, w);
        for (int64_t c = n; c < L; c++) d[j * L + c] = 0.0f;
    }
    dm_stream_fence();
    mm(0, 0, (int)L, (int)P, (int)L, 1.0f, d, L, v, a->ldq, io->ctx + o * a->ldc + h * P, a->ldc, pack);
}

/* One item of the backward pass. */
static void attn_bwd_item(const dm_attn_dims *a, const dm_attn_io *io, uint64_t seed, int64_t s, int64_t h, int64_t o,
                          int64_t L, float *work) {
    const int64_t J = a->J, P = a->P;
    float *pack = work, *d = work + DM_GEMM_DIRECT_PACK_FLOATS, *g = d + J * J;
    uint32_t *w = (uint32_t *)(d + 2 * J * J);
    const float *pr = io->probs + (s * a->H + h) * J * J;
    const int64_t iq = o * a->ldq + h * P, ic = o * a->ldc + h * P, id = o * a->ldd + h * P;
    for (int64_t j = 0; j < L; j++) {
        const int64_t n = a->causal ? j + 1 : L;
        drop_row(a, seed, s, h, j, pr + j * J, d + j * L, n, w);
        for (int64_t c = n; c < L; c++) d[j * L + c] = 0.0f;
    }
    /* dV = dropout(P)^T dctx; dP = dctx V^T */
    mm(1, 0, (int)L, (int)P, (int)L, 1.0f, d, L, io->dctx + ic, a->ldc, io->dv + id, a->ldd, pack);
    mm(0, 1, (int)L, (int)L, (int)P, 1.0f, io->dctx + ic, a->ldc, io->v + iq, a->ldq, g, L, pack);
    const float scale = a->p > 0 ? (float)(1.0 / (1.0 - a->p)) : 1.0f;
    for (int64_t j = 0; j < L; j++) {
        float *x = g + j * L;
        const float *y = pr + j * J, *dj = d + j * L;
        const int64_t n = a->causal ? j + 1 : L;
        /* the dropout's backward, its mask read off the dropped probabilities: where one
         * is 0 but kept, the probability is 0 and so is dS whatever dP is */
        if (a->p > 0)
            for (int64_t c = 0; c < n; c++) x[c] = dj[c] != 0.0f ? x[c] * scale : 0.0f;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < n; c++) sum += x[c] * y[c];
        for (int64_t c = 0; c < n; c++) x[c] = y[c] * (x[c] - sum);
        for (int64_t c = n; c < L; c++) x[c] = 0.0f;
    }
    /* dQ = alpha dS K; dK = alpha dS^T Q */
    mm(0, 0, (int)L, (int)P, (int)L, a->alpha, g, L, io->k + iq, a->ldq, io->dq + id, a->ldd, pack);
    mm(1, 0, (int)L, (int)P, (int)L, a->alpha, g, L, io->q + iq, a->ldq, io->dk + id, a->ldd, pack);
}

dm_status dm_cpu_attn(const dm_attn_dims *a, const dm_attn_io *io, uint64_t seed, int bwd, float *work,
                      int nthreads) {
    int64_t *own = io->off ? NULL : malloc(sizeof(int64_t) * (size_t)(a->B + 1));
    if (!io->off && !own) return dm_fail(DM_ERR_OOM, "out of memory for the attention's sequence offsets");
    dm_status st = own && !io->mask ? dm_live_offsets(a->B, a->J, io->lengths, own) : DM_OK;
    for (int64_t s = 0; own && io->mask && s <= a->B; s++) own[s] = s * a->J; /* whole sequences */
    const int64_t *off = io->off ? io->off : own;
    int64_t *ord = st == DM_OK ? item_order(a, off) : NULL;
    if (st == DM_OK && !ord) st = dm_fail(DM_ERR_OOM, "out of memory for the attention's work list");
    if (st == DM_OK) {
        const int64_t items = a->B * a->H, per = dm_cpu_attn_work_floats(a->J);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
        for (int64_t it = 0; it < items; it++) {
            const int64_t s = ord[it / a->H], h = it % a->H, o = off[s], L = off[s + 1] - o;
            float *wk = work + (int64_t)omp_get_thread_num() * per;
            if (L == 0) continue;
            if (bwd)
                attn_bwd_item(a, io, seed, s, h, o, L, wk);
            else
                attn_item(a, io, seed, s, h, o, L, wk);
        }
    }
    free(ord);
    free(own);
    return st;
}
