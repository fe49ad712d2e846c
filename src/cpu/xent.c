/* xent.c: the fused decoder and cross-entropy (LINEAR_XENT, LINEAR_XENT_BWD; ops.def) on
 * the CPU. The logits of the m rows scored (m x v, v the vocabulary) are never written
 * whole: each thread takes a contiguous block of the vocabulary and walks it in chunks of
 * DM_XENT_CHUNK columns, a chunk's logits (m x chunk) made by one single-threaded sgemm
 * into the thread's buffer and used while they are in its caches.
 *   forward: per row and thread, an online logsumexp (the running max and the sum of exp
 *     below it, rescaled when the max grows), the argmax (the first column holding the
 *     max: ties to the lowest id) and the label's logit; the threads' partials merged in
 *     thread order (deterministic for a thread count).
 *   backward: the chunk's logits again (one more GEMM than the unfused head), dl = dloss *
 *     (exp(logit - lse) - onehot) in place, dbias = dl's column sums (rows in order),
 *     dW rows of the chunk = dl^T t (written once), dt += dl W_chunk into the thread's own
 *     accumulator (thread 0's: dt itself), summed after in thread order.
 * W is read once per pass (each thread its own rows), t once per chunk (from cache). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/vmath.h"

/* The block [*c0, *c1) of the vocabulary thread `tid` of `nt` takes: whole chunks. */
static void vocab_block(int64_t v, int tid, int nt, int64_t *c0, int64_t *c1) {
    const int64_t chunks = (v + DM_XENT_CHUNK - 1) / DM_XENT_CHUNK;
    const int64_t a = chunks * tid / nt, b = chunks * (tid + 1) / nt;
    *c0 = a * DM_XENT_CHUNK < v ? a * DM_XENT_CHUNK : v;
    *c1 = b * DM_XENT_CHUNK < v ? b * DM_XENT_CHUNK : v;
}

int64_t dm_cpu_xent_work_floats(int bwd, int64_t m, int64_t e, int nthreads) {
    /* per thread: the chunk's logits; forward the row partials (max, sum, argmax, its
     * value, the label's logit), backward a dt accumulator (thread 0 uses dt itself) */
    const int64_t per = m * DM_XENT_CHUNK + (bwd ? m * e : 5 * m);
    return per * nthreads;
}

/* One chunk's logits L (m x n, row stride n) + bias, folded into the row partials. */
static void fold_chunk(const float *restrict L, const float *restrict bias, const float *restrict labels, int64_t m,
                       int64_t n, int64_t c0, int64_t v, float *restrict mx, float *restrict sm, float *restrict am,
                       float *restrict av, float *restrict lab) {
    for (int64_t r = 0; r < m; r++) {
        const float *restrict x = L + r * n;
        float cm = -INFINITY;
        int64_t arg = 0;
        for (int64_t c = 0; c < n; c++) {
            const float y = x[c] + bias[c];
            if (y > cm) cm = y, arg = c;
        }
        if (cm > av[r]) av[r] = cm, am[r] = (float)(c0 + arg); /* ties: the earlier chunk's id */
        float M = mx[r], S = sm[r];
        if (cm > M) {
            S = M == -INFINITY ? 0.0f : S * dm_exp_neg(M - cm);
            M = cm;
        }
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < n; c++) s += dm_exp_neg(x[c] + bias[c] - M);
        mx[r] = M;
        sm[r] = S + s;
        const int64_t l = dm_index_row(labels[r], v);
        if (l >= c0 && l < c0 + n) lab[r] = x[l - c0] + bias[l - c0];
    }
}

void dm_cpu_linear_xent(const float *t, const float *W, const float *bias, const float *labels, int64_t m,
                        int64_t e, int64_t v, float *loss, float *lse, float *pred, float *work, int nthreads) {
    const int64_t per = m * DM_XENT_CHUNK + 5 * m;
#pragma omp parallel num_threads(nthreads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *L = work + per * tid, *mx = L + m * DM_XENT_CHUNK, *sm = mx + m, *am = sm + m, *av = am + m,
              *lab = av + m;
        for (int64_t r = 0; r < m; r++) mx[r] = -INFINITY, sm[r] = 0, am[r] = 0, av[r] = -INFINITY, lab[r] = 0;
        int64_t b0, b1;
        vocab_block(v, tid, nt, &b0, &b1);
        for (int64_t c0 = b0; c0 < b1; c0 += DM_XENT_CHUNK) {
            const int64_t n = b1 - c0 < DM_XENT_CHUNK ? b1 - c0 : DM_XENT_CHUNK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)e, 1.0f, t, (int)e,
                        W + c0 * e, (int)e, 0.0f, L, (int)n);
            fold_chunk(L, bias + c0, labels, m, n, c0, v, mx, sm, am, av, lab);
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; r++) {
            float M = -INFINITY, best = -INFINITY, arg = 0, x_l = 0;
            for (int q = 0; q < nt; q++) {
                const float *p = work + per * q + m * DM_XENT_CHUNK;
                M = p[r] > M ? p[r] : M;
                if (p[3 * m + r] > best) best = p[3 * m + r], arg = p[2 * m + r];
                x_l += p[4 * m + r]; /* one thread saw the label's column */
            }
            float S = 0;
            for (int q = 0; q < nt; q++) {
                const float *p = work + per * q + m * DM_XENT_CHUNK;
                if (p[r] > -INFINITY) S += p[m + r] * dm_exp_neg(p[r] - M);
            }
            const float ls = logf(S);
            lse[r] = M + ls;
            pred[r] = arg;
            loss[r] = dm_index_row(labels[r], v) >= 0 ? (M - x_l) + ls : 0.0f; /* as XENT's row kernel */
        }
    }
}

/* The chunk's logits L (m x n) into dl = dloss * (exp(L + bias - lse) - onehot), 0 on a
 * row whose label is no column; dbias of the chunk = the column sums. */
static void chunk_grad(float *restrict L, const float *restrict bias, const float *restrict labels,
                       const float *restrict lse, const float *restrict dloss, int64_t m, int64_t n, int64_t c0,
                       int64_t v, float *restrict dbias) {
    for (int64_t c = 0; c < n; c++) dbias[c] = 0.0f;
    for (int64_t r = 0; r < m; r++) {
        float *restrict x = L + r * n;
        const int64_t l = dm_index_row(labels[r], v);
        if (l < 0) {
            for (int64_t c = 0; c < n; c++) x[c] = 0.0f;
            continue;
        }
        const float w = dloss[r], s = lse[r];
#pragma omp simd
        for (int64_t c = 0; c < n; c++) x[c] = w * dm_exp_neg(x[c] + bias[c] - s);
        if (l >= c0 && l < c0 + n) x[l - c0] -= w; /* w * (p - 1): XENT_BWD's (p - 1) * w */
        for (int64_t c = 0; c < n; c++) dbias[c] += x[c];
    }
}

void dm_cpu_linear_xent_bwd(const float *t, const float *W, const float *bias, const float *labels,
                            const float *lse, const float *dloss, int64_t m, int64_t e, int64_t v, float *dt,
                            float *dW, float *dbias, float *work, int nthreads) {
    const int64_t per = m * DM_XENT_CHUNK + m * e;
#pragma omp parallel num_threads(nthreads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *L = work + per * tid, *acc = tid ? L + m * DM_XENT_CHUNK : dt;
        memset(acc, 0, sizeof(float) * (size_t)(m * e));
        int64_t b0, b1;
        vocab_block(v, tid, nt, &b0, &b1);
        for (int64_t c0 = b0; c0 < b1; c0 += DM_XENT_CHUNK) {
            const int64_t n = b1 - c0 < DM_XENT_CHUNK ? b1 - c0 : DM_XENT_CHUNK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)e, 1.0f, t, (int)e,
                        W + c0 * e, (int)e, 0.0f, L, (int)n);
            chunk_grad(L, bias + c0, labels, lse, dloss, m, n, c0, v, dbias + c0);
            /* dW rows c0..c0+n = dl^T t; dt += dl W_chunk */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)e, (int)m, 1.0f, L, (int)n, t, (int)e,
                        0.0f, dW + c0 * e, (int)e);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)e, (int)n, 1.0f, L, (int)n,
                        W + c0 * e, (int)e, 1.0f, acc, (int)e);
        }
#pragma omp barrier
        if (nt > 1) {
#pragma omp for schedule(static)
            for (int64_t q = 0; q < m * e; q++) {
                float s = dt[q];
                for (int k = 1; k < nt; k++) s += work[per * k + m * DM_XENT_CHUNK + q];
                dt[q] = s;
            }
        }
    }
}
