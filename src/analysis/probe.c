/* probe.c: measures the CPU model the roofline analysis uses (`dmove probe`):
 *  - memory bandwidth: a STREAM-style triad a = b + s*c and a read-only sum, OpenMP over
 *    all threads, arrays of 96 MiB each (far beyond a 32 MiB L3), best of repeats; bytes
 *    counted as STREAM does (each array element once: no write-allocate traffic);
 *  - contraction rate: cblas_sgemm (the BLAS dmove uses) on square fp32 matrices for
 *    1..N threads (openblas_set_num_threads), best of repeats;
 *  - vector rate: an in-register FMA loop on every thread (the non-contraction ceiling).
 * Everything together takes a few seconds to ~30 s. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "core/sysinfo.h"
#include "analysis/device.h"
#include "core/status.h"

static void note(void (*progress)(const char *), const char *fmt, ...) DM_PRINTF(2, 3);
#include <stdarg.h>
static void note(void (*progress)(const char *), const char *fmt, ...) {
    if (!progress) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    progress(line);
}

static void cpu_model(char *out, size_t n) { dm_cpu_model_name(out, n, "unknown CPU"); }

/* --- memory bandwidth ------------------------------------------------------------------ */

static double triad(float *restrict a, const float *restrict b, const float *restrict c,
                    int64_t n, int nt) {
    double t0 = omp_get_wtime();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
    return omp_get_wtime() - t0;
}

static double readsum(const float *restrict a, int64_t n, int nt, float *sink) {
    double t0 = omp_get_wtime();
    float s = 0;
#pragma omp parallel for simd num_threads(nt) schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i];
    double t = omp_get_wtime() - t0;
    *sink += s;
    return t;
}

/* --- vector rate ----------------------------------------------------------------------- */

/* 2 * lanes * chains * iters flop on independent accumulators (enough chains to cover
 * the FMA latency on two pipes). */
static double fma_loop(int64_t iters, float *out) {
#if defined(__AVX512F__)
    enum { L = 16 };
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    /* distinct starting values, or the compiler sees twelve copies of one chain */
#define S(k) _mm512_set1_ps(1.0f + 0.01f * (k) + 1e-3f * (float)omp_get_thread_num())
    __m512 x0 = S(0), x1 = S(1), x2 = S(2), x3 = S(3), x4 = S(4), x5 = S(5), x6 = S(6),
           x7 = S(7), x8 = S(8), x9 = S(9), x10 = S(10), x11 = S(11);
#undef S
    for (int64_t r = 0; r < iters; r++) {
        x0 = _mm512_fmadd_ps(x0, m, c); x1 = _mm512_fmadd_ps(x1, m, c);
        x2 = _mm512_fmadd_ps(x2, m, c); x3 = _mm512_fmadd_ps(x3, m, c);
        x4 = _mm512_fmadd_ps(x4, m, c); x5 = _mm512_fmadd_ps(x5, m, c);
        x6 = _mm512_fmadd_ps(x6, m, c); x7 = _mm512_fmadd_ps(x7, m, c);
        x8 = _mm512_fmadd_ps(x8, m, c); x9 = _mm512_fmadd_ps(x9, m, c);
        x10 = _mm512_fmadd_ps(x10, m, c); x11 = _mm512_fmadd_ps(x11, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                             _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)));
    *out += _mm512_reduce_add_ps(s);
#elif defined(__FMA__)
    enum { L = 8 };
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    /* distinct starting values, or the compiler sees twelve copies of one chain */
#define S(k) _mm256_set1_ps(1.0f + 0.01f * (k) + 1e-3f * (float)omp_get_thread_num())
    __m256 x0 = S(0), x1 = S(1), x2 = S(2), x3 = S(3), x4 = S(4), x5 = S(5), x6 = S(6),
           x7 = S(7), x8 = S(8), x9 = S(9), x10 = S(10), x11 = S(11);
#undef S
    for (int64_t r = 0; r < iters; r++) {
        x0 = _mm256_fmadd_ps(x0, m, c); x1 = _mm256_fmadd_ps(x1, m, c);
        x2 = _mm256_fmadd_ps(x2, m, c); x3 = _mm256_fmadd_ps(x3, m, c);
        x4 = _mm256_fmadd_ps(x4, m, c); x5 = _mm256_fmadd_ps(x5, m, c);
        x6 = _mm256_fmadd_ps(x6, m, c); x7 = _mm256_fmadd_ps(x7, m, c);
        x8 = _mm256_fmadd_ps(x8, m, c); x9 = _mm256_fmadd_ps(x9, m, c);
        x10 = _mm256_fmadd_ps(x10, m, c); x11 = _mm256_fmadd_ps(x11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float v[8];
    _mm256_storeu_ps(v, s);
    for (int k = 0; k < 8; k++) *out += v[k];
#else
    enum { L = 1 };
    float x[12];
    for (int k = 0; k < 12; k++) x[k] = 1.0f + 0.01f * (float)k;
    for (int64_t r = 0; r < iters; r++)
        for (int k = 0; k < 12; k++) x[k] = x[k] * 0.999999f + 1e-7f;
    for (int k = 0; k < 12; k++) *out += x[k];
#endif
    return 2.0 * L * 12 * (double)iters;
}

/* --- the probe ------------------------------------------------------------------------- */

dm_status dm_cpu_probe(dm_cpu_profile *p, int max_threads, void (*progress)(const char *)) {
    if (!p) return dm_fail(DM_ERR_INVALID_ARG, "dm_cpu_probe: NULL profile");
    memset(p, 0, sizeof *p);
    int nt = max_threads > 0 ? max_threads : omp_get_max_threads();
    if (nt > DM_PROFILE_MAX_THREADS) nt = DM_PROFILE_MAX_THREADS;
    p->version = DM_PROFILE_VERSION;
    p->threads = nt;
    cpu_model(p->machine, sizeof p->machine);
    if (gethostname(p->host, sizeof p->host - 1) != 0) snprintf(p->host, sizeof p->host, "unknown");
    time_t now = time(NULL);
    struct tm tmv;
    if (now == (time_t)-1 || !gmtime_r(&now, &tmv) ||
        !strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tmv))
        snprintf(p->date, sizeof p->date, "unknown");

    /* 1. bandwidth */
    const int64_t n = (int64_t)24 << 20; /* 24 Mi floats = 96 MiB per array */
    float *a = aligned_alloc(64, (size_t)n * 4), *b = aligned_alloc(64, (size_t)n * 4),
          *c = aligned_alloc(64, (size_t)n * 4);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return dm_fail(DM_ERR_OOM, "cannot allocate 288 MiB for the bandwidth probe");
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, c[i] = 2; /* first touch, same split */
    note(progress, "memory bandwidth: triad and read over 3 x 96 MiB arrays, %d threads", nt);
    double best_t = 1e30, best_r = 1e30;
    float sink = 0;
    for (int rep = 0; rep < 20; rep++) {
        best_t = fmin(best_t, triad(a, b, c, n, nt));
        best_r = fmin(best_r, readsum(b, n, nt, &sink));
    }
    p->triad_bw = 3.0 * 4.0 * (double)n / best_t;
    p->read_bw = 4.0 * (double)n / best_r;
    free(a), free(b), free(c);
    if (sink == 12345.678f) note(progress, " "); /* keeps the sums alive */
    note(progress, "  triad %.1f GB/s, read %.1f GB/s", p->triad_bw / 1e9, p->read_bw / 1e9);

    /* 2. vector rate on all threads */
    double vbest = 0;
    for (int rep = 0; rep < 5; rep++) {
        double flop_total = 0, t0 = omp_get_wtime();
        float vs = 0;
#pragma omp parallel num_threads(nt) reduction(+ : flop_total, vs)
        flop_total += fma_loop((int64_t)4 << 20, &vs);
        double t = omp_get_wtime() - t0;
        vbest = fmax(vbest, flop_total / t);
        sink += vs;
    }
    p->vector_flops = vbest;
    note(progress, "vector FMA rate: %.1f GFLOP/s on %d threads", vbest / 1e9, nt);

    /* 3. SGEMM per thread count */
    const int m = 2048;
    p->sgemm_n = m;
    float *A = aligned_alloc(64, (size_t)m * m * 4), *B = aligned_alloc(64, (size_t)m * m * 4),
          *C = aligned_alloc(64, (size_t)m * m * 4);
    if (!A || !B || !C) {
        free(A), free(B), free(C);
        return dm_fail(DM_ERR_OOM, "cannot allocate 48 MiB for the SGEMM probe");
    }
    for (int64_t i = 0; i < (int64_t)m * m; i++)
        A[i] = (float)(i % 17) * 0.01f, B[i] = (float)(i % 13) * 0.01f, C[i] = 0;
    int counts[DM_PROFILE_MAX_THREADS], nc = 0;
    for (int t = 1; t <= nt && nc < DM_PROFILE_MAX_THREADS; t = t < 8 ? t + 1 : t * 2)
        counts[nc++] = t;
    if (counts[nc - 1] != nt && nc < DM_PROFILE_MAX_THREADS) counts[nc++] = nt;
    /* OpenBLAS's OpenMP threads wait for one another: a team smaller than it was told
     * (OMP_THREAD_LIMIT, OMP_DYNAMIC) would spin for ever */
    if (omp_get_dynamic()) omp_set_dynamic(0);
    const int lim = omp_get_thread_limit();
    for (int k = 0; k < nc; k++) {
        if (counts[k] > lim) { /* the rest of the counts are past it too */
            nc = k;
            break;
        }
        openblas_set_num_threads(counts[k]);
        /* best of at least 5 runs and 1 s: on a shared machine (a VM's sibling vCPU
         * busy for a moment) the best run is the machine's rate, a short burst is not */
        double best = 1e30, start = omp_get_wtime();
        for (int rep = 0; rep < 200 && (rep < 5 || omp_get_wtime() - start < 1.0); rep++) {
            double t0 = omp_get_wtime();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, A, m, B, m,
                        0.0f, C, m);
            double t = omp_get_wtime() - t0;
            if (rep > 0) best = fmin(best, t); /* rep 0: warm-up (threads, pages) */
        }
        p->sgemm_threads[p->nsgemm] = counts[k];
        p->sgemm_flops[p->nsgemm++] = 2.0 * m * (double)m * m / best;
        note(progress, "SGEMM %dx%dx%d, %d thread%s: %.1f GFLOP/s", m, m, m, counts[k],
             counts[k] > 1 ? "s" : "", 2.0 * m * (double)m * m / best / 1e9);
    }
    openblas_set_num_threads(omp_get_max_threads() < lim ? omp_get_max_threads() : lim);
    free(A), free(B), free(C);
    return DM_OK;
}
